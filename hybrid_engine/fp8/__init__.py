"""fp8 training of the linear layers' GEMMs (after torchao's float8 training, Micikevicius et al. 2022): each
GEMM's two operands quantized to float8 with dynamic scales computed from their absolute maxima every call, the
product accumulated in higher precision. Master weights, gradients and the optimizer are untouched: the engine's
fp32 masters and buckets. quantize.py: scales and casts; matmul.py: the three GEMMs of a linear layer as one
autograd function; linear.py: the layers that swap in for the tensor-parallel ones."""
