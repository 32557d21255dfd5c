"""How parameters get updated: optimizers by name and as factories, and the engine's update strategies
(optimizers.py: the fused SGD + cast, torch's own step), fp32 masters of half weights (masters.py), the loss scaler's
overflow watch and gradient clipping over the grid (scaling.py), and the distributed optimizer ZeRO-1 (zero.py),
which shards masters and optimizer state over DP and all-gathers the updated weights (parallel/data_parallel's
param_gather overlaps that with the next forward).

Imports: config, parallel (the gradient buffer's layout, the grid's groups, placement of split tensors),
hybrid_engine._C. The Engine imports this package; nothing below it does.
"""
from .optimizers import NAMES, SGD, Adam, AdamW, OptimizerFactory, describe, from_name, state_bytes

__all__ = ["NAMES", "SGD", "Adam", "AdamW", "OptimizerFactory", "describe", "from_name", "state_bytes"]
