"""The Engine: the wiring of one training step over a DP x PP x MP grid (engine.py), and what only the step uses.

    engine.py        Engine, StepResult: stages, programs, gradient buffer, executor, optimizer and scaler
    stage_specs.py   the shapes that travel between pipeline stages, probed once
    micro_batches.py a step's data on one rank, micro-batch by micro-batch
    losses.py        the loss specs (the built-in MSE, the vocab-parallel cross-entropy, any callable)
    optim.py         optimizers by name and the update strategies (fused SGD + cast, torch's step)
    precision.py     fp32 masters of half weights
    amp.py           the loss scaler's overflow watch, gradient clipping

Imports from the package: config, parallel, models (materialize), checkpoint.engine_state (the state the Engine
exports and loads). The training loop (train) and the runtime sit above it.
"""
