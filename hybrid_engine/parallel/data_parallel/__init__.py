"""Data parallelism: the gradient buffer's flat buckets and fp32 main grads (grad_buffer.py), the distributed
optimizer ZeRO-1 (zero.py) and its overlapped parameter all-gather (param_gather.py), and tied weights' gradients
summed between the first and the last stage (tied.py). Imports: config, parallel.tensor, engine's update helpers.
"""
