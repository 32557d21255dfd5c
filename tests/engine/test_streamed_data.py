"""Streamed micro-batches: Engine.train_step takes callables micro -> tensor, and the executor draws each
micro-batch when the forward that consumes it runs (PipelineExecutor::run_streamed), so a step's batch is never
resident as a whole. The training must be exactly the resident-batch one; each micro-batch is drawn once, in
forward order, and dropped once its backward is done."""
from __future__ import annotations

import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from hybrid_engine import ProcessGrid
from engine_builders import make_engine
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model

REPO = Path(__file__).resolve().parents[2]
DIM, DEPTH, BATCH, MICRO, STEPS = 32, 6, 32, 4, 3


def train(rank: int, world: int, runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        groups = build_groups(ProcessGrid(1, 2, 1), rank)
        engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, schedule=run["schedule"],
                             micro_batches=MICRO, lr=0.05, merge_weight_grads=run["schedule"] == "zb1",
                             lookahead=run.get("lookahead", 0), amp=run.get("amp", "off"),
                             recompute=run.get("recompute", False),
                             stage_impl="auto" if run.get("native", True) else "autograd")
        data = SyntheticRegression(DIM, 0, "cpu")
        rows = BATCH // MICRO
        losses, draws, alive_at_draw = [], [], []
        live: list[weakref.ref] = []
        for step in range(STEPS):
            if not run["streamed"]:
                x, y = data.batch(step, BATCH)
                losses.append(engine.train_step(x, y).loss)
                continue

            def inputs(micro: int, step=step) -> torch.Tensor:
                # how many earlier micro-batches of this step are still held when this one is drawn
                alive_at_draw.append(sum(ref() is not None for ref in live))
                draws.append((step, "x", micro))
                x = data.draw(step, micro * rows, (micro + 1) * rows, targets=False)[0]
                live.append(weakref.ref(x))
                return x

            def targets(micro: int, step=step) -> torch.Tensor:
                draws.append((step, "y", micro))
                return data.draw(step, micro * rows, (micro + 1) * rows, inputs=False)[1]

            live.clear()
            losses.append(engine.train_step(inputs if engine.holds_first_stage else None,
                                            targets if engine.holds_last_stage else None).loss)
            alive_at_draw.append(("end", sum(ref() is not None for ref in live)))
        out.append({"losses": losses, "draws": draws, "alive": alive_at_draw, "pp_rank": groups.coords.pp,
                    "state": {k: t.numpy() for k, t in engine.full_state_dict().items()}})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


CASES = {
    "1f1b": {"schedule": "1f1b"},
    "zb1 merged W, lookahead 1": {"schedule": "zb1", "lookahead": 1},
    "gpipe": {"schedule": "gpipe"},
    "fp16 half weights": {"schedule": "1f1b", "amp": "fp16"},
    "autograd stages": {"schedule": "1f1b", "native": False},
    # the last stage's forward, loss and target draw move into its backward
    "gpipe recompute": {"schedule": "gpipe", "recompute": True},
}


@pytest.fixture(scope="module")
def results():
    runs = [dict(case, streamed=streamed) for case in CASES.values() for streamed in (True, False)]
    return run_ranks(2, train, runs, timeout=240)


@pytest.mark.parametrize("index,name", list(enumerate(CASES)))
def test_streamed_steps_train_exactly_like_resident_ones(results, index, name):
    for rank_runs in results:
        streamed, resident = rank_runs[2 * index], rank_runs[2 * index + 1]
        assert streamed["losses"] == resident["losses"], name
        for key in streamed["state"]:
            assert (streamed["state"][key] == resident["state"][key]).all(), (name, key)


@pytest.mark.parametrize("index,name", list(enumerate(CASES)))
def test_each_micro_batch_is_drawn_once_when_first_needed(results, index, name):
    for rank_runs in results:
        run = rank_runs[2 * index]
        kind = "x" if run["pp_rank"] == 0 else "y"
        expected = [(step, kind, m) for step in range(STEPS) for m in range(MICRO)]
        if kind == "x":  # the first step also draws micro-batch 0 once to learn the stage shapes
            expected.insert(0, (0, "x", 0))
        # in forward order; with recompute the last stage draws its targets in the deferred forward of each
        # backward, whose order (this GPipe's B0, B1, ...) is the forward's
        assert run["draws"] == expected, name


def test_stage_zero_holds_only_its_in_flight_micro_batches(results):
    """1F1B at pp=2: stage 0 has at most 2 micro-batches between forward and backward, so when it draws
    micro-batch k, at most one earlier input of the step is still alive; none once the step is over."""
    stage0 = next(r for r in results if r[0]["pp_rank"] == 0)[2 * list(CASES).index("1f1b")]
    at_draws = [a for a in stage0["alive"] if isinstance(a, int)]
    at_ends = [a[1] for a in stage0["alive"] if not isinstance(a, int)]
    assert len(at_draws) == STEPS * MICRO + 1 and max(at_draws) == 1, at_draws
    assert at_ends == [0] * STEPS, at_ends


def bad_source(rank: int, world: int, kind: str) -> str:
    groups = build_groups(ProcessGrid(1, 1, 1), rank)
    engine = make_engine(large_linear_model(DIM, DEPTH, 0), groups, micro_batches=MICRO)
    data = SyntheticRegression(DIM, 0, "cpu")
    x, y = data.batch(0, BATCH)
    try:
        if kind == "returns None":
            engine.train_step(lambda micro: None, y)
        elif kind == "no inputs":
            engine.train_step(None, y)
        return "no error"
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("kind,message", [("returns None", "must return a tensor"),
                                          ("no inputs", "holds the first stage: train_step needs its inputs")])
def test_a_bad_source_is_one_clear_error(kind, message):
    [error] = run_ranks(1, bad_source, kind, timeout=60)
    assert message in error, error


def test_driver_stream_data_flag_gives_the_same_losses():
    args = ["--pp", "2", "--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "4", "--steps", "3"]

    def losses(extra: list[str]) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                               "hybrid_engine.py", *args, *extra], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return [line.split()[3] for line in done.stdout.splitlines() if line.startswith("step ")]

    assert losses(["--stream-data"]) == losses([]) != []
