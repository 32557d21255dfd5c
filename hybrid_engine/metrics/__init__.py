"""What a run measures: model FLOPs and MFU (flops.py), the traced timeline of a step's actions and collectives
(trace.py) and its drawing (timeline.py), TensorBoard scalars (tensorboard.py). Imports: parallel.pipeline (the
simulator the trace is compared with)."""
