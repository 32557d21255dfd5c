"""The C++ DynamicLossScaler and clip_grad_norm in one process: torch.amp.GradScaler's trajectory, unscale
arithmetic, static mode, hysteresis, checkpoint round trip, and clipping against torch's own."""
from __future__ import annotations

import io
import logging

import pytest
import torch

from hybrid_engine.optim import scaling as amp
from hybrid_engine.optim.scaling import DynamicLossScaler, OverflowWatch, clip_grad_norm, make_loss_scaler

# 40 steps: isolated overflows, a long run that takes the scale below 1, recoveries that grow it again.
OVERFLOW_STEPS = {2, 3, 9, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 36}
STEPS = 40


def grads_for_step(step: int, scale: float, with_fp16: bool = True) -> list:
    """A scaled fp32 and fp16 gradient (or fp32 alone: GradScaler refuses fp16 grads); at overflow steps one
    of them holds inf or NaN."""
    g32 = torch.linspace(-1.0, 1.0, 7) * scale
    g16 = (torch.linspace(0.0, 0.5, 5) * min(scale, 1024.0)).half()
    if step in OVERFLOW_STEPS:
        (g32 if step % 2 or not with_fp16 else g16)[step % 5] = float("nan") if step % 3 else float("inf")
    return [g32, None, g16] if with_fp16 else [g32]


def run_ours(scaler: DynamicLossScaler, steps: range) -> list[tuple[float, bool]]:
    history = []
    for step in steps:
        found_inf = scaler.unscale_and_check(grads_for_step(step, scaler.scale))
        scaler.update(found_inf)
        history.append((scaler.scale, found_inf))
    return history


def run_grad_scaler(growth_factor: float, backoff_factor: float, growth_interval: int) -> list[tuple[float, bool]]:
    gs = torch.amp.GradScaler(
        "cpu", init_scale=2.0**16, growth_factor=growth_factor, backoff_factor=backoff_factor,
        growth_interval=growth_interval,
    )
    p32 = torch.nn.Parameter(torch.zeros(7))
    opt = torch.optim.SGD([p32], lr=0.0)
    history = []
    for step in range(STEPS):
        gs.scale(torch.ones(()))  # materialises the scale on first use
        (p32.grad,) = grads_for_step(step, gs.get_scale(), with_fp16=False)
        gs.unscale_(opt)
        found_inf = sum(v.item() for v in gs._found_inf_per_device(opt).values()) > 0
        gs.step(opt)
        gs.update()
        history.append((gs.get_scale(), found_inf))
    return history


@pytest.mark.parametrize("growth_factor,backoff_factor,growth_interval", [(2.0, 0.5, 3), (1.7, 0.3, 2)])
def test_scale_trajectory_matches_torch_grad_scaler(growth_factor, backoff_factor, growth_interval):
    ours = DynamicLossScaler(
        growth_factor=growth_factor, backoff_factor=backoff_factor, growth_interval=growth_interval, min_scale=0.0
    )
    expected = run_grad_scaler(growth_factor, backoff_factor, growth_interval)
    got = run_ours(ours, range(STEPS))
    assert got == expected  # exact: both keep the scale in fp32 and compute the update in fp64
    assert min(s for s, _ in got) < 1.0  # the long overflow run went below the default floor
    assert ours.skipped_steps == len(OVERFLOW_STEPS)


def test_min_scale_floors_the_trajectory_and_is_otherwise_torch_s():
    floored = run_ours(DynamicLossScaler(growth_interval=3), range(STEPS))
    free = run_ours(DynamicLossScaler(growth_interval=3, min_scale=0.0), range(STEPS))
    assert min(s for s, _ in floored) == 1.0
    first_below = next(i for i, (s, _) in enumerate(free) if s < 1.0)
    assert floored[:first_below] == free[:first_below]
    assert [f for _, f in floored] == [f for _, f in free]


def test_unscale_multiplies_by_inverse_scale_and_skips_none():
    scaler = DynamicLossScaler(init_scale=1024.0)
    g32 = torch.randn(10, generator=torch.Generator().manual_seed(0)) * 1024
    g16 = (torch.randn(6, generator=torch.Generator().manual_seed(1)) * 1024).half()
    expected32, expected16 = g32 / 1024, (g16.float() / 1024).half()
    assert scaler.unscale_and_check([g32, None, g16]) is False
    assert torch.equal(g32, expected32) and torch.equal(g16, expected16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_gradient_is_found(dtype, bad):
    scaler = DynamicLossScaler()
    grads = [torch.ones(4, dtype=dtype), torch.ones(3, dtype=dtype)]
    grads[1][2] = bad
    assert scaler.unscale_and_check(grads) is True


@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")])
def test_find_nonfinite_on_one_process_only_reads_and_agrees_with_unscale_and_check(bad):
    scaler = DynamicLossScaler(init_scale=1024.0)
    g = torch.Generator().manual_seed(2)
    grads = [torch.randn(37, generator=g) * 1024, None, (torch.randn(6, generator=g) * 1024).half()]
    if bad is not None:
        grads[2][5] = bad
    before = [t.clone() for t in grads if t is not None]
    flag = scaler.find_nonfinite(grads, None, torch.device("cpu"))
    assert flag.dtype == torch.float32 and flag.shape == (1,)
    assert flag.item() == (0.0 if bad is None else 1.0)
    for now, then in zip([t for t in grads if t is not None], before):  # not unscaled
        torch.testing.assert_close(now, then, rtol=0, atol=0, equal_nan=True)
    assert scaler.unscale_and_check(grads) is (bad is not None)
    assert scaler.scale == 1024.0  # the check alone never moves the scale: update() does


def test_find_nonfinite_without_gradients_puts_a_clear_flag_on_the_given_device():
    flag = DynamicLossScaler().find_nonfinite([None, None], device=torch.device("meta"))
    assert flag.device.type == "meta" and flag.shape == (1,)
    assert DynamicLossScaler().find_nonfinite([]).item() == 0.0


@pytest.mark.parametrize("scale", [65536.0, 1000.0, 3.0, 2.0**-3, 12345.678])
def test_inv_scale_is_grad_scaler_s(scale):
    gs = torch.amp.GradScaler("cpu", init_scale=scale)
    gs.scale(torch.ones(()))  # materialises the scale
    expected = gs._scale.double().reciprocal().float().item()  # what GradScaler.unscale_ multiplies by
    assert DynamicLossScaler(init_scale=scale, min_scale=0.0).inv_scale == expected


def test_fp16_value_that_overflows_only_when_scaled_is_found():
    # 2 * 65536 is past fp16's max (65504): the scaled gradient became inf during backward
    g = (torch.tensor([2.0]) * 65536).half()
    assert DynamicLossScaler().unscale_and_check([g]) is True


def test_no_gradients_is_no_overflow():
    assert DynamicLossScaler().unscale_and_check([None, None]) is False


def test_static_scale_never_changes_but_still_skips():
    scaler = make_loss_scaler("fp16", loss_scale=128.0)
    assert scaler.is_static
    history = run_ours(scaler, range(STEPS))
    assert {s for s, _ in history} == {128.0}
    assert [f for _, f in history] == [step in OVERFLOW_STEPS for step in range(STEPS)]
    assert scaler.skipped_steps == len(OVERFLOW_STEPS)


def test_state_dict_round_trip_continues_the_same_trajectory():
    straight = DynamicLossScaler(growth_interval=3, hysteresis=2)
    expected = run_ours(straight, range(STEPS))

    first = DynamicLossScaler(growth_interval=3, hysteresis=2)
    head = run_ours(first, range(17))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert state == first.state_dict()
    assert all(isinstance(v, (int, float)) for v in state.values())

    resumed = DynamicLossScaler(growth_interval=3, hysteresis=2)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == first.state_dict()
    assert head + run_ours(resumed, range(17, STEPS)) == expected
    assert resumed.skipped_steps == straight.skipped_steps


def test_load_state_dict_rejects_a_missing_key_and_static_keeps_its_scale():
    scaler = DynamicLossScaler()
    state = scaler.state_dict()
    del state["growth_tracker"]
    with pytest.raises(KeyError, match="growth_tracker"):
        scaler.load_state_dict(state)
    static = DynamicLossScaler(init_scale=8.0, static=True)
    static.load_state_dict({**DynamicLossScaler().state_dict(), "skipped_steps": 5})
    assert static.scale == 8.0 and static.skipped_steps == 5


def test_hysteresis_follows_megatron():
    # hysteresis=2: the first overflow since the last growth is tolerated; later ones (consecutive or not)
    # back off; a growth refills the allowance. Every overflow resets the growth count and is skipped.
    scaler = DynamicLossScaler(init_scale=64.0, growth_interval=3, hysteresis=2)
    pattern = [1, 0, 1, 1, 0, 0, 0, 1, 0, 1]
    scales, trackers = [], []
    for overflow in pattern:
        scaler.update(bool(overflow))
        scales.append(scaler.scale)
        trackers.append(scaler.hysteresis_tracker)
    assert scales == [64, 64, 32, 16, 16, 16, 32, 32, 32, 16]
    assert trackers == [1, 1, 0, 0, 0, 0, 2, 1, 1, 0]
    assert scaler.skipped_steps == 5


def test_overflow_counters_and_watch_warn_on_persistent_overflow(caplog):
    scaler = DynamicLossScaler()
    watch = OverflowWatch(threshold=3)
    warned = []
    with caplog.at_level(logging.WARNING, logger=amp.__name__):
        for step, overflow in enumerate([1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0]):
            scaler.update(bool(overflow))
            warned.append(watch.observe(scaler, step))
    assert scaler.consecutive_overflows == 0 and scaler.skipped_steps == 9
    assert [i for i, w in enumerate(warned) if w] == [5, 8]
    assert len(caplog.records) == 2 and "3 steps in a row at step 5" in caplog.records[0].getMessage()


def test_make_loss_scaler_modes_and_validation():
    assert make_loss_scaler("off") is None and make_loss_scaler("bf16") is None
    dynamic = make_loss_scaler("fp16", scale_window=100, hysteresis=2)
    assert (dynamic.scale, dynamic.growth_interval, dynamic.hysteresis, dynamic.is_static) == (65536.0, 100, 2, False)
    with pytest.raises(ValueError, match="--amp"):
        make_loss_scaler("fp8")
    with pytest.raises(ValueError, match="--loss-scale"):
        make_loss_scaler("bf16", loss_scale=4.0)
    with pytest.raises(RuntimeError, match="hysteresis"):
        DynamicLossScaler(hysteresis=0)
    with pytest.raises(RuntimeError, match="scale-window"):
        DynamicLossScaler(growth_interval=0)


def _grads(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(17, 5, generator=g), torch.randn(5, generator=g), torch.randn(3, 3, generator=g)]


def test_clip_matches_torch_clip_grad_norm_on_one_rank():
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in _grads(0)]
    for p, g in zip(params, _grads(0)):
        p.grad = g
    expected_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0).item()
    split, replicated = _grads(0)[:2], _grads(0)[2:]
    norm = clip_grad_norm(split, [None] + replicated, max_norm=1.0)
    assert norm == pytest.approx(expected_norm, rel=1e-6)
    for p, g in zip(params, split + replicated):
        torch.testing.assert_close(g, p.grad, rtol=1e-6, atol=1e-7)


def test_clip_leaves_grads_alone_below_max_norm_when_measuring_or_non_finite():
    grads = _grads(1)
    before = [g.clone() for g in grads]
    norm = clip_grad_norm(grads, [], max_norm=1e6)
    assert norm == pytest.approx(torch.cat([g.flatten() for g in before]).double().norm().item(), rel=1e-6)
    assert clip_grad_norm(grads, [], max_norm=0.0) == norm
    assert all(torch.equal(a, b) for a, b in zip(grads, before))
    grads[1][0] = float("inf")
    before = [g.clone() for g in grads]
    assert clip_grad_norm(grads[:1], grads[1:], max_norm=1e-3) == float("inf")
    assert all(torch.equal(a, b) for a, b in zip(grads, before))


def test_clip_norm_of_fp16_grads_does_not_overflow():
    g = torch.full((4,), 60000.0, dtype=torch.half)  # norm 120000 > fp16 max
    assert clip_grad_norm([g], [], max_norm=0.0) == pytest.approx(120000.0, rel=1e-6)
