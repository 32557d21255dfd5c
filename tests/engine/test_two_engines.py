"""Two engines in one process: nothing a step touches is process-wide (the gradient buffer with its main-grad
routes, deferred weight gradients and final-gradient listener belongs to one engine), so two engines with
different models, interleaved step by step, train exactly as each does alone, and closing one leaves the other
working."""
from __future__ import annotations

import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model

STEPS = 4
# Different models and paths that all defer weight gradients (zb1): native chains with bf16 half weights (fp32
# main grads routed through the buffer), and autograd stages with recomputation.
ENGINES = {
    "a": dict(dim=16, depth=4, schedule="zb1", merge_weight_grads=True, amp="bf16", stage_impl="auto"),
    "b": dict(dim=24, depth=6, schedule="zb1", stage_impl="autograd", recompute=True, optimizer="adam"),
}


def _build(name: str, groups):
    cfg = dict(ENGINES[name])
    dim, depth = cfg.pop("dim"), cfg.pop("depth")
    engine = make_engine(large_linear_model(dim, depth, seed=len(name) + ord(name)), groups, micro_batches=2,
                         lr=0.05, **cfg)
    return engine, SyntheticRegression(dim, 0, "cpu")


def _step(engine, data, step: int, dp: int, d: int) -> float:
    x, y = data.batch(step, 16)
    rows = slice(d * 16 // dp, (d + 1) * 16 // dp)
    return engine.train_step(x[rows], y[rows]).loss


def two_engines(rank: int, world: int, dp: int, pp: int) -> dict:
    groups = build_groups(ProcessGrid(dp, pp, 1), rank)
    d = groups.coords.dp
    alone = {}
    for name in ENGINES:
        engine, data = _build(name, groups)
        alone[name] = [_step(engine, data, s, dp, d) for s in range(STEPS)]
        engine.close()
        dist.barrier()
    (a, data_a), (b, data_b) = _build("a", groups), _build("b", groups)
    together = {"a": [], "b": []}
    for s in range(STEPS // 2):  # interleaved, step by step
        together["a"].append(_step(a, data_a, s, dp, d))
        together["b"].append(_step(b, data_b, s, dp, d))
    a.close()  # b keeps training after a is gone
    for s in range(STEPS // 2, STEPS):
        together["b"].append(_step(b, data_b, s, dp, d))
    b.close()
    groups.destroy()
    return {"alone": alone, "together": together}


def test_two_engines_interleaved_train_exactly_as_each_alone():
    for out in run_ranks(1, two_engines, 1, 1, timeout=120):
        assert out["together"]["a"] == out["alone"]["a"][: STEPS // 2]
        assert out["together"]["b"] == out["alone"]["b"]


def test_two_engines_on_a_dp2_pp2_grid():
    for out in run_ranks(4, two_engines, 2, 2, timeout=180):
        assert out["together"]["a"] == out["alone"]["a"][: STEPS // 2]
        assert out["together"]["b"] == out["alone"]["b"]
