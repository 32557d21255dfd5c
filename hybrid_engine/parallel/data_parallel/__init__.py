"""Data parallelism: the gradient buffer's flat buckets and fp32 main grads (grad_buffer.py), the distributed
optimizer's (optim/zero.py, ZeRO 1-3) overlapped parameter all-gather (param_gather.py), ZeRO-3's sharded parameters
gathered around their use (param_shards.py), who shares one sharded copy (shard_groups.py: hybrid sharding, the
clipping group), and tied weights' gradients summed between the first and the last stage (tied.py). Imports:
config, parallel.tensor, engine's update helpers.
"""
