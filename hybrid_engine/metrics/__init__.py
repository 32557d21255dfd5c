"""What a run measures: model FLOPs and MFU (flops.py), the traced timeline of a step's actions and collectives
(trace.py) and its drawing (timeline.py), TensorBoard scalars (tensorboard.py), the kinds of a --metrics file's
records and the one reader of them (records.py). Imports: parallel.pipeline (the simulator the trace is compared
with)."""
