"""The planner: from the model's shape and a model of the card, the schedule, virtual stages, merged W,
lookahead and micro-batch count the run's flags leave to auto; and, for the plan command, the grids.

    card.py          what the planner knows of a device: a table (H100, H200), a CPU estimate, a calibration
    model_shape.py   the run's model per layer (parameters, FLOPs, activations kept, MP all-reduces), as its
                     registry entry gives it (models/planner_shape.py)
    setting.py       the grid, batch, precision and optimizer a plan runs inside
    candidates.py    the plans weighed, each legal by the configuration's own checks
    context.py       a context-parallel rank's share of the shape, the cp sizes the plan command ranks, the driver's
                     hint of the cp that fits
    context_comm.py  cp's K/V transfers per layer (the ring's exposed hops, the all-gather's collectives) and the
                     --cp-comm auto rule the engine asks
    step_time.py     a plan's step: stage costs into the C++ simulator, plus DP x CP and the update
    memory.py        a plan's peak memory per pipeline rank at its ZeRO level, and whether it fits a cap
    choose.py        the fastest plan within the memory cap, and the line that says it
    run_plan.py      the driver's entry: a RunConfig's auto fields filled; measured against predicted
    grids.py         every grid of a world size (and cp size) under every ZeRO level, planned and ranked, with why
                     the losers lose (python -m hybrid_engine.plan, --plan-only)
    refit.py         the card's terms refitted to a run's measured steps, every plan predicted again, the switch

Imports config, models (the registry, shapes), parallel.pipeline (the simulator); nothing above (engine, train).
"""

from .candidates import Plan, Request
from .card import CARDS, Card
from .choose import Choice, NoPlanFits, Prediction, choose
from .run_plan import compare_text, plan_run

__all__ = ["CARDS", "Card", "Choice", "NoPlanFits", "Plan", "Prediction", "Request", "choose", "compare_text",
           "plan_run"]
