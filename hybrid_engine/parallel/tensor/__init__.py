"""Tensor (model) parallelism: Megatron's column- and row-parallel layers and parallelize_mlp (layers.py), sequence
parallelism's collectives (sequence_parallel.py), the vocab-parallel cross-entropy (vocab_cross_entropy.py). The
collectives themselves are C++ autograd functions (csrc/tp). Imports: hybrid_engine._C only.
"""
