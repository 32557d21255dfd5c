"""Any model, any loss, any optimizer: a user's nn.Sequential with GELU and LayerNorm, a smooth-L1 loss and
torch.optim.AdamW from a factory trains on dp x pp x mp CPU ranks exactly like plain PyTorch on one process."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dist_utils import run_ranks
from hybrid_engine import ProcessGrid
from hybrid_engine.engine.engine import Engine
from hybrid_engine.config.engine import PrecisionConfig, ScheduleConfig
from hybrid_engine.parallel.grid import build_groups

STEPS, BATCH, MICRO, LR = 4, 32, 2, 3e-3


def user_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16),
                         nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 16, generator=gen)
    return x, torch.tanh(x[:, :8] * 2)


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.1)


def huber(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.smooth_l1_loss(output, target)


def reference(factory=None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch on one process, the whole batch per step (the engine's mean over micro-batches and DP)."""
    model = user_model()
    opt = (factory or adamw)(model.parameters())
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        loss = huber(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()


def train(rank: int, world: int, dp: int, pp: int, mp: int, schedule: str) -> dict:
    groups = build_groups(ProcessGrid(dp, pp, mp), rank)
    engine = Engine(user_model(), huber, groups, optimizer=adamw, schedule=ScheduleConfig(schedule, MICRO))
    d, rows = groups.coords.dp, BATCH // dp
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        losses.append(engine.train_step(x[d * rows:(d + 1) * rows], y[d * rows:(d + 1) * rows]).loss)
    state = {k: v.numpy() for k, v in engine.full_state_dict().items()}
    plans = [p.native for p in engine.plans]
    engine.close()
    groups.destroy()
    return {"losses": losses, "state": state if d == 0 and groups.coords.mp == 0 else {}, "native": plans}


def _check(results, want_losses, want_state):
    state = {}
    for out in results:
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(out["losses"], want_losses)), out["losses"]
        state.update(out["state"])
        assert out["native"] == [False] * len(out["native"])  # GELU and LayerNorm: autograd stages, announced
    assert state.keys() == want_state.keys()
    for key, want in want_state.items():
        got = torch.from_numpy(state[key])
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), key


def test_user_model_matches_plain_pytorch_on_dp2_pp2_mp2():
    want_losses, want_state = reference()
    _check(run_ranks(8, train, 2, 2, 2, "1f1b", timeout=240), want_losses, want_state)


def test_user_model_matches_plain_pytorch_under_zb1_on_pp2_mp2():
    want_losses, want_state = reference()
    _check(run_ranks(4, train, 1, 2, 2, "zb1", timeout=240), want_losses, want_state)


def train_bf16(rank: int, world: int, impl: str) -> dict:
    """bf16 half weights: the LayerNorm's and the Linears' gradients all reach the fp32 masters."""
    groups = build_groups(ProcessGrid(1, 2, 1), rank)
    engine = Engine(user_model(), huber, groups, optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
                    schedule=ScheduleConfig("1f1b", MICRO), precision=PrecisionConfig("bf16", impl))
    before = {k: v.clone() for k, v in engine.full_state_dict().items()}
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        losses.append(engine.train_step(x, y).loss)
    after = engine.full_state_dict()
    engine.close()
    groups.destroy()
    return {"losses": losses, "moved": {k: float((after[k] - before[k]).abs().max()) for k in after}}


def test_every_parameter_trains_with_bf16_half_weights():
    """With half weights, parameters that autograd (not hybrid_engine's layers) writes — the LayerNorm's — are
    folded into their fp32 main grads too; the curve stays close to the fp32 reference."""
    want_losses, _ = reference(lambda params: torch.optim.SGD(params, lr=0.1))
    for impl in ("half-weights", "autocast"):
        for out in run_ranks(2, train_bf16, impl, timeout=120):
            assert all(moved > 0 for moved in out["moved"].values()), (impl, out["moved"])
            assert out["losses"] == pytest.approx(want_losses, rel=2e-2), impl
