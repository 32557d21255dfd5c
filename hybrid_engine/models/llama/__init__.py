"""A Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention): its shape and RoPE (config.py), its
layers in plain PyTorch (model.py), its tensor- and sequence-parallel plan (parallelize.py), its FLOPs (flops.py),
its [model] options (options.py) and its workload and rules (workload.py)."""
