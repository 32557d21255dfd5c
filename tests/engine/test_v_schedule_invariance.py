"""The V schedules (zbv, dualpipev) on pp2 and pp4 train the single-process model (fp32, CPU, relative 1e-5): the
v placement's local turn on the last rank, the first and last stage both on rank 0, split and whole backwards mixed
(dualpipev), with DP, MP, ZeRO-1, recompute and merged W."""
import pytest
import torch

from dist_utils import run_ranks
from engine_ranks import sweep
from engine_reference import reference_run

# dualpipev needs 2 pp micro-batches: 8 for pp4
CFG = dict(dim=64, depth=8, batch_size=3360, micro_batches=8, steps=4, lr=0.05)


@pytest.fixture(scope="module")
def reference():
    return reference_run(CFG["dim"], CFG["depth"], CFG["batch_size"], CFG["micro_batches"], CFG["steps"], CFG["lr"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check(results, runs, world, reference, what):
    ref_losses, ref_state = reference
    for index, run in enumerate(runs):
        state = {}
        for r in range(world):
            assert results[r][index]["losses"] == pytest.approx(ref_losses, rel=1e-5), (what, run, r)
            state.update({k: torch.from_numpy(v) for k, v in results[r][index]["state"].items()})
        assert set(state) == set(ref_state), (what, run)
        worst = max(_rel(state[k], ref_state[k]) for k in ref_state)
        assert worst < 1e-5, (what, run, worst)


def test_v_schedules_match_single_process(reference):
    """pp4 and pp2 (beside dp2 or mp2), native chains; then autograd stages with full recompute, ZeRO-1 and the W's
    merged (zbv; dualpipev runs some backwards whole, so its W's stay per micro-batch)."""
    runs = [(1, 4, 1, "zbv", 2), (1, 4, 1, "dualpipev", 2), (2, 2, 1, "zbv", 2), (1, 2, 2, "dualpipev", 2)]
    _check(run_ranks(4, sweep, runs, CFG, timeout=300), runs, 4, reference, "native")
    cfg = dict(CFG, stage_impl="autograd", recompute=True, zero=1, merge_weight_grads=True)
    runs = [(2, 2, 1, "zbv", 2), (2, 2, 1, "dualpipev", 2)]
    _check(run_ranks(4, sweep, runs, cfg, timeout=300), runs, 4, reference, "autograd, recompute, zero 1, merged W")
