"""Native stages: the executor runs Linear(+ReLU) chains itself, without autograd (NativeChainStage in
csrc/executor/stage_program.h), and with the built-in MSE computes the loss's gradient together with the loss.

The native path must train exactly like the autograd path it replaces (same kernels in the same order), so
these tests compare the two bit for bit on gloo ranks, across schedules, recomputation, half weights, a loss
that is not the built-in MSE, and a stage that is not a chain.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model

CFG = dict(dim=32, depth=6, batch_size=32, micro_batches=4, steps=3, lr=0.05)


def huber_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """A loss the executor cannot compute natively: it goes through Python and autograd."""
    return F.smooth_l1_loss(output, target)


def with_gelu(model: nn.Sequential) -> nn.Sequential:
    """The same model with its last ReLU swapped for a GELU: the stage holding it is no longer a chain."""
    layers = list(model)
    last_relu = max(i for i, m in enumerate(layers) if isinstance(m, nn.ReLU))
    layers[last_relu] = nn.GELU()
    return nn.Sequential(*layers)


def train(rank: int, world: int, runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        groups = build_groups(ProcessGrid(run.get("dp", 1), run.get("pp", 2), 1), rank)
        model = large_linear_model(CFG["dim"], CFG["depth"], 0)
        if run.get("gelu"):
            model = with_gelu(model)
        engine = make_engine(model, groups, loss=run.get("loss"), schedule=run.get("schedule", "1f1b"),
                             micro_batches=CFG["micro_batches"], virtual_stages=run.get("v", 1), lr=CFG["lr"],
                             merge_weight_grads=run.get("merge", False), recompute=run.get("recompute", False),
                             amp=run.get("amp", "off"), impl=run.get("impl", "half-weights"),
                             stage_impl="auto" if run["native"] else "autograd")
        data = SyntheticRegression(CFG["dim"], 0, "cpu")
        losses = []
        for step in range(CFG["steps"]):
            x, y = data.batch(step, CFG["batch_size"])
            losses.append(engine.train_step(x, y).loss)
        out.append({"losses": losses, "native": [s for s, p in engine.stage_programs.items() if p.native],
                    "stages": list(engine.stage_ids),
                    "state": {k: t.numpy() for k, t in engine.full_state_dict().items()}})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


VARIANTS = {
    "1f1b": {},
    "zb1 merged W": {"schedule": "zb1", "merge": True},
    "zb1 per-micro W": {"schedule": "zb1"},
    "interleaved": {"schedule": "interleaved", "v": 2},
    "recompute": {"recompute": True},
    "bf16 half weights": {"amp": "bf16"},
    "fp16 half weights": {"amp": "fp16", "schedule": "zb1", "merge": True},
    "python loss": {"loss": huber_loss},
    "stage that is not a chain": {"gelu": True},
}


@pytest.fixture(scope="module")
def results():
    runs = [dict(variant, native=native) for variant in VARIANTS.values() for native in (True, False)]
    return run_ranks(2, train, runs, timeout=240)


@pytest.mark.parametrize("index,name", list(enumerate(VARIANTS)))
def test_native_stages_train_exactly_like_autograd(results, index, name):
    for rank_runs in results:
        native, plain = rank_runs[2 * index], rank_runs[2 * index + 1]
        assert native["losses"] == plain["losses"], name
        assert native["state"].keys() == plain["state"].keys()
        for key in native["state"]:
            assert (native["state"][key] == plain["state"][key]).all(), (name, key)
        assert plain["native"] == []


@pytest.mark.parametrize("index,name", list(enumerate(VARIANTS)))
def test_every_chain_stage_runs_native(results, index, name):
    for rank_runs in results:
        native = rank_runs[2 * index]
        if name == "stage that is not a chain":
            # The GELU sits in the last stage (1 of 2): that one runs through autograd, the other stays native.
            assert native["native"] == [s for s in native["stages"] if s != 1]
        else:
            assert native["native"] == native["stages"], name


def test_autocast_keeps_autograd():
    [[run]] = run_ranks(1, train, [{"pp": 1, "amp": "fp16", "impl": "autocast", "native": True}], timeout=120)
    assert run["native"] == []
