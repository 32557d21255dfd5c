"""A Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention): its shape and RoPE (config.py), its
layers, dense or tensor-parallel with sequence parallelism (model.py), its parallelize function (parallelize.py),
its FLOPs (flops.py), its [model] options (options.py) and its workload and rules (workload.py)."""
