"""The Engine: the wiring of one training step over a DP x PP x MP grid (engine.py), and what only the step uses.

    engine.py        Engine: stages, programs, gradient buffer, executor, optimizer and scaler
    step_result.py   StepResult: what one step reports
    stage_specs.py   the shapes that travel between pipeline stages, probed once
    micro_batches.py a step's data on one rank, micro-batch by micro-batch
    evaluate.py      the forward-only validation loss

The losses it takes are models/losses.py's; optimizers, fp32 masters, loss scaling and clipping are optim/'s.

Imports from the package: config, parallel, models (materialize), checkpoint.engine_state (the state the Engine
exports and loads). The training loop (train) and the runtime sit above it.
"""
