"""The grid, a mesh of named axes (dp, cp, pp, mp alias tp, ep; csrc/grid/process_grid.h).

    grid.py          build_groups: this rank's DP, PP (one two-rank group per channel), MP, and with cp > 1 CP and
                     DP x CP process groups; the mapping table and the grid picture
    nodes.py         which ranks share a host; MP groups kept inside a node
    pipeline/        schedules, stage programs (native or autograd), the cut of a model into stages, balancing
    tensor/          tensor-parallel layers (Megatron column/row), sequence parallelism, vocab-parallel loss
    data_parallel/   the gradient buffer and its buckets, ZeRO-1, its parameter all-gather, tied weights
    context/         context parallelism: the head-tail split of sequences, ring and all-gather attention

Imports from the package: config and hybrid_engine._C only (models, engine and train sit above it).
"""
