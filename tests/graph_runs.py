"""The course MLP trained with its native stages CUDA-graphed and eager, the same steps on the same data, for the
graph tests: on gloo ranks with the graphs replayed by the host (tests/parallel/test_graphed_stages.py), and on GPUs
with real CUDA graphs (tests/parallel/test_cuda_graphs_gpu.py, one process per GPU under torchrun:
`python -m torch.distributed.run --nproc_per_node=N tests/graph_runs.py OUT RUNS_JSON`).

A run is a dict: dp, pp, mp, schedule, v (virtual stages), m (micro-batches), amp, zero, graphs ("off", "on" or
"host": on with the host's replay)."""
from __future__ import annotations

import os
import sys

import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the tests' helpers, and the repository's package under torchrun

from engine_builders import make_engine  # noqa: E402
from graph_jobs import train_each  # noqa: E402
from hybrid_engine import ProcessGrid  # noqa: E402
from hybrid_engine.models import SyntheticRegression, large_linear_model  # noqa: E402
from hybrid_engine.parallel.grid import build_groups  # noqa: E402
from hybrid_engine.parallel.pipeline.graphs import GraphChoice, graphed  # noqa: E402

DIM, DEPTH, BATCH, STEPS, LR = 32, 8, 32, 6, 0.05


def train(rank: int, world: int, runs: list[dict], device: str = "cpu") -> list[dict]:
    return train_each(_train_one, rank, runs, device)


def _train_one(rank: int, run: dict, device: str) -> dict:
    """One run of the table on this rank: its losses, scales, skipped steps, graph counts and state."""
    groups = build_groups(ProcessGrid(run.get("dp", 1), run.get("pp", 1), run.get("mp", 1)), rank)
    mode = {"host": "off"}.get(run["graphs"], run["graphs"])
    # fp16: a scale that doubles after every clean step, so the loss multiplier changes between replays and
    # overflows now and then (skipped steps, the scale halved)
    engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, schedule=run.get("schedule", "1f1b"),
                         micro_batches=run.get("m", 4), virtual_stages=run.get("v", 1), lr=LR,
                         amp=run.get("amp", "off"), scale_window=1, zero=run.get("zero", 0), device=device,
                         cuda_graphs=mode)
    if run["graphs"] == "host":
        engine._programs = graphed(engine._programs, GraphChoice(True, "test"), device, host_rerun=True)
    data = SyntheticRegression(DIM, 0, device)
    losses, scales, skipped = [], [], []
    for step in range(STEPS):
        x, y = data.batch(step, BATCH)
        result = engine.train_step(x, y)
        losses.append(result.loss)
        scales.append(result.loss_scale)
        skipped.append(result.skipped)
    replaying = [p for p in engine.stage_programs.values() if hasattr(p, "captures")]
    record = {"losses": losses, "scales": scales, "skipped": skipped,
              "counts": [(p.captures, p.replays) for p in replaying], "graphs": engine.cuda_graphs.on,
              "state": {k: t.float().numpy() for k, t in engine.full_state_dict().items()}}
    engine.close()
    record["slots_after_close"] = [p.slots for p in replaying]  # freed by close, though still held here
    groups.destroy()
    dist.barrier()
    return record


if __name__ == "__main__":  # one rank of a GPU run under torchrun: OUT RUNS_JSON
    from graph_jobs import torchrun_rank

    torchrun_rank(train)


def train_changing_shapes(rank: int, world: int, graphs: str) -> dict:
    """One rank, streamed micro-batches: two steps of 32 rows, two of 16, one of 32 again (each shape change runs
    eagerly, then captures again); every micro-batch's input and target drawn exactly once."""
    groups = build_groups(ProcessGrid(1, 1, 1), rank)
    engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, micro_batches=2, lr=LR, cuda_graphs="off")
    if graphs == "host":
        engine._programs = graphed(engine._programs, GraphChoice(True, "test"), "cpu", host_rerun=True)
    data = SyntheticRegression(DIM, 0, "cpu")
    draws: list[tuple[str, int, int]] = []
    losses = []
    for step, batch in enumerate((32, 32, 16, 16, 32)):
        x, y = data.batch(step, batch)

        def source(t, what):
            return lambda micro: draws.append((what, step, micro)) or t.chunk(2)[micro]

        losses.append(engine.train_step(source(x, "input"), source(y, "target")).loss)
    [program] = engine.stage_programs.values()
    out = {"losses": losses, "draws": draws, "counts": getattr(program, "captures", None),
           "state": {k: t.numpy() for k, t in engine.full_state_dict().items()}}
    engine.close()
    groups.destroy()
    return out


def train_rescheduled(rank: int, world: int, graphs: str) -> dict:
    """pp2: two steps of 1F1B (graphs replayed by the host where graphs == "host"), then two of zb1, whose W actions
    are not graphed: the engine goes back to its eager programs and says so."""
    from hybrid_engine.config.engine import ScheduleConfig

    groups = build_groups(ProcessGrid(1, 2, 1), rank)
    engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, micro_batches=4, lr=LR, cuda_graphs="auto")
    if graphs == "host":
        engine.cuda_graphs = GraphChoice(True, "test")
        engine._programs = graphed(engine._programs, engine.cuda_graphs, "cpu", host_rerun=True)
    data = SyntheticRegression(DIM, 0, "cpu")
    losses, kinds = [], []
    for step in range(4):
        if step == 2:
            engine.reschedule(ScheduleConfig("zb1", 4, 1, 0, False))
        losses.append(engine.train_step(*data.batch(step, BATCH)).loss)
        kinds.append(sorted({type(p).__name__ for p in engine.stage_programs.values()}))
    out = {"losses": losses, "kinds": kinds, "graphs": engine.cuda_graphs.describe()}
    engine.close()
    groups.destroy()
    return out
