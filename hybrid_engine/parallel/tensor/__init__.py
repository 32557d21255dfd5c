"""Tensor (model) parallelism: Megatron's column- and row-parallel layers and parallelize_mlp (layers.py), sequence
parallelism's collectives and replicated norms (sequence_parallel.py), vocabulary-split tables and heads
(vocab_parallel.py), heads replicated over more ranks than there are (replicated_heads.py), the vocab-parallel
cross-entropy (vocab_cross_entropy.py); a model's declarative plan applied by parallelize_module (plan.py), and
full weights loaded into split parameters (full_weights.py). The collectives themselves are C++ autograd functions
(csrc/tp). Imports: hybrid_engine._C only.
"""
