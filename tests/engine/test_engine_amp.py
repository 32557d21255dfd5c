"""Mixed precision in the engine: an overflow on one rank is a skipped step on every rank; bf16 keeps grid
invariance within bf16 tolerance, in both half-precision implementations; fp16 plain SGD, whose overflow check
and unscale are folded into the fused step, trains bit for bit as the unscale-in-place path did."""
import numpy as np
import pytest

from dist_utils import run_ranks
from engine_ranks import amp_overflow_run, fp16_sgd_paths, train_precision
from engine_reference import reference_run

CFG = dict(dim=32, depth=4, batch_size=16, micro_batches=4, steps=5, lr=0.05)


def test_inf_on_one_rank_skips_the_step_everywhere_and_halves_the_scale():
    inject_rank, inject_step = 3, 2
    results = run_ranks(4, amp_overflow_run, 1, 2, 2, CFG, inject_rank, inject_step, timeout=120)
    histories = [r["history"] for r in results]
    assert all(h == histories[0] for h in histories), "ranks disagree on the scale history"
    used, skipped, after = zip(*histories[0])
    assert skipped == (False, False, True, False, False)
    assert used[inject_step] == 65536.0 and after[inject_step] == 32768.0
    assert used[inject_step + 1] == 32768.0  # later steps proceed at the halved scale
    for r in results:
        before, after_step = r["states"]["before"], r["states"]["after"]
        for key, value in before.items():
            assert np.array_equal(value, after_step[key]), f"{key} changed in a skipped step"


@pytest.mark.parametrize("impl", ["autocast", "half-weights"])
def test_bf16_grids_match_one_rank_within_bf16_tolerance(impl):
    one = run_ranks(1, train_precision, [(1, 1, 1, "1f1b")], CFG, "bf16", impl, timeout=120)[0][0]
    runs = [(1, 2, 2, "1f1b"), (2, 2, 1, "zb1"), (1, 4, 1, "gpipe"), (4, 1, 1, "1f1b")]
    curves = run_ranks(4, train_precision, runs, CFG, "bf16", impl, timeout=180)[0]
    for run, curve in zip(runs, curves):
        assert curve == pytest.approx(one, rel=2e-2), run


def _inverse(scale: float) -> np.float32:
    return np.float32(1.0 / np.float64(scale))  # GradScaler's reciprocal: fp64, then fp32


@pytest.mark.parametrize("loss_scale,scale_window,inject_rank,inject_step", [
    (None, 2, 3, 2),       # dynamic: grows after steps 1 and 4, backs off at the injected overflow
    (1000.0, 2000, -1, -1),  # static, not a power of two: 1/scale rounds, so the order of the roundings shows
])
def test_fp16_fused_unscale_trains_exactly_as_unscale_in_place(loss_scale, scale_window, inject_rank, inject_step):
    cfg = dict(CFG, steps=6)
    results = run_ranks(4, fp16_sgd_paths, 1, 2, 2, cfg, inject_rank, inject_step, loss_scale, scale_window,
                        timeout=120)
    for rank, r in enumerate(results):
        fused, unscaled = r["fused"], r["unscaled"]
        strip = [(loss, skipped, used, after) for loss, skipped, used, _, after in fused["history"]]
        assert strip == [(loss, skipped, used, after) for loss, skipped, used, _, after in unscaled["history"]]
        assert all(h[3] is None for h in fused["history"]), "the fused path measures no norm"
        for key, value in unscaled["states"]["final"].items():
            assert np.array_equal(fused["states"]["final"][key], value), f"rank {rank}: {key}"
        # What the fused path leaves in the gradient buffers: the scaled gradients, which the old path had
        # unscaled in place by the same fp32 multiply.
        inv = _inverse(fused["history"][-1][2])
        for got, want in zip(fused["buckets"], unscaled["buckets"]):
            assert np.array_equal(got * inv, want)
            assert not np.array_equal(got, want)

    used = [h[2] for h in results[0]["fused"]["history"]]
    skipped = [h[1] for h in results[0]["fused"]["history"]]
    if inject_step < 0:
        assert skipped == [False] * cfg["steps"] and set(used) == {loss_scale}
        reference, _ = reference_run(cfg["dim"], cfg["depth"], cfg["batch_size"], cfg["micro_batches"],
                                     cfg["steps"], cfg["lr"])
        assert [h[0] for h in results[0]["fused"]["history"]] == pytest.approx(reference, rel=1e-2)
        return
    assert skipped == [step == inject_step for step in range(cfg["steps"])]
    assert used == [65536.0, 65536.0, 131072.0, 65536.0, 65536.0, 131072.0]
    for r in results:  # the skipped step left every weight, half and master, as it was
        before, after = r["fused"]["states"]["before"], r["fused"]["states"]["after"]
        assert all(np.array_equal(value, after[key]) for key, value in before.items())
