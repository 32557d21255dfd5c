"""Fused kernels for a transformer's elementwise work, applied from outside the model (the models stay plain
modules): RMSNorm, rotary position embeddings, SwiGLU, and a chunked linear + cross-entropy that never holds the
full fp32 logits. `apply.py`'s pass swaps the model's modules for these after its tensor-parallel plan, as the plan
swaps in parallel layers; `options.py` decides which run gets them. On a CUDA device with Triton each is a
torch.compile'd region (Inductor writes one Triton kernel for its forward and one for its backward); elsewhere the
same code runs eagerly and equals the unfused model."""
