"""Pipeline parallelism, Python side: schedules by name (the C++ core's generators, simulator and validator), the
stage programs each stage runs (stages.py: native C++ chains or autograd modules), and the cut of a model into
stages (partition.py by layer count, balance.py by cost). Imports: config, parallel.tensor, hybrid_engine._C.
"""
