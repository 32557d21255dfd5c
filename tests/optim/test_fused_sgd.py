"""The fused SGD + cast of half-weights training (csrc/optim/sgd_cast.h) against torch.optim.SGD + copy.

The CPU path runs in CI; the CUDA kernel runs when a GPU is present (the GPU pass runs this file too)."""
import pytest
import torch

from hybrid_engine import _C
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.optim.masters import MasterWeights

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference_step(masters, grads, lr, half_dtype):
    params = [torch.nn.Parameter(m.clone()) for m in masters]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.optim.SGD(params, lr=lr).step()
    return [p.detach() for p in params], [p.detach().to(half_dtype) for p in params]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matches_sgd_then_copy(device, half_dtype):
    gen = torch.Generator(device=device).manual_seed(7)
    # Sizes that exercise the vector body, its tail and tensors shorter than one vector; the flat buffers are
    # cut at odd offsets so some views are not vector-aligned (the kernel must take its scalar path there).
    sizes = [4099, 1, 3, 4096, 257]
    total = sum(sizes) + len(sizes)
    flat_master = torch.randn(total, device=device, generator=gen)
    flat_grad = torch.randn(total, device=device, generator=gen)
    flat_half = torch.full((total,), float("nan"), device=device, dtype=half_dtype)  # poison: all must be written
    masters, grads, halves, offset = [], [], [], 1
    for n in sizes:
        masters.append(flat_master[offset:offset + n])
        grads.append(flat_grad[offset:offset + n])
        halves.append(flat_half[offset:offset + n])
        offset += n + 1
    want_masters, want_halves = reference_step(masters, grads, 0.0625, half_dtype)
    _C.sgd_step_and_cast(masters, grads, halves, 0.0625)
    for got, want in zip(masters, want_masters):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for got, want in zip(halves, want_halves):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=0, atol=0) if device == "cpu" else \
            torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_large_tensor_every_element_written(device):
    n = (1 << 20) + 12  # several grid-stride rounds on the GPU
    master = torch.randn(n, device=device)
    grad = torch.randn(n, device=device)
    half = torch.full((n,), float("nan"), device=device, dtype=torch.float16)
    expected = master - 0.5 * grad
    _C.sgd_step_and_cast([master], [grad], [half], 0.5)
    torch.testing.assert_close(master, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(half.float(), expected.half().float(), rtol=1e-3, atol=1e-3)


def test_master_weights_step_skips_parameters_without_gradient():
    params = [torch.nn.Parameter(torch.randn(8, 4).half()), torch.nn.Parameter(torch.randn(4).half())]
    masters = MasterWeights(params)
    masters.masters[0].grad = torch.ones(8, 4)
    before = masters.masters[1].detach().clone(), params[1].detach().clone()
    masters.sgd_step_and_cast(0.25)
    torch.testing.assert_close(params[0].detach(), (masters.masters[0].detach()).half(), rtol=0, atol=0)
    assert torch.equal(masters.masters[1].detach(), before[0]) and torch.equal(params[1].detach(), before[1])


def test_shape_and_dtype_errors_are_clear():
    with pytest.raises(ValueError, match="float32"):
        _C.sgd_step_and_cast([torch.zeros(3, dtype=torch.float64)], [torch.zeros(3)], [torch.zeros(3)], 0.1)
    with pytest.raises(ValueError, match="mismatched shapes"):
        _C.sgd_step_and_cast([torch.zeros(3)], [torch.zeros(4)], [torch.zeros(3)], 0.1)
    with pytest.raises(ValueError, match="1 masters, 0 grads"):
        _C.sgd_step_and_cast([torch.zeros(3)], [], [torch.zeros(3)], 0.1)


def test_only_plain_sgd_takes_the_fused_path():
    """The update strategy is chosen once, from the factory the user passed (never from sniffing the optimizer
    it returns): the built-in plain SGD with half weights fuses; momentum, weight decay, Adam, or any other
    callable take torch's step. The fused step reads the learning rate at each step, so schedulers apply."""
    halves = [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]
    masters = MasterWeights(halves)

    def strategy(factory):
        return type(optim.make_update(factory, masters.masters, masters, torch.device("cpu"))[1])

    assert strategy(optim.SGD(lr=0.5)) is optim.FusedSGDCast
    assert strategy(optim.SGD(lr=0.5, momentum=0.9)) is optim.TorchStep
    assert strategy(optim.SGD(lr=0.5, weight_decay=1e-4)) is optim.TorchStep
    assert strategy(optim.Adam(lr=0.5)) is optim.TorchStep
    assert strategy(lambda params: torch.optim.SGD(params, lr=0.5)) is optim.TorchStep
    fp32 = [torch.nn.Parameter(torch.zeros(2))]
    assert type(optim.make_update(optim.SGD(lr=0.5), fp32, None, torch.device("cpu"))[1]) is optim.TorchStep

    optimizer, update = optim.make_update(optim.SGD(lr=0.5), masters.masters, masters, torch.device("cpu"))
    optimizer.param_groups[0]["lr"] = 0.125  # what an LR scheduler does: the fused step must see it
    masters.masters[0].grad = torch.ones(2)
    update.step()
    assert masters.masters[0].detach().tolist() == [-0.125, -0.125]
    assert halves[0].detach().float().tolist() == [-0.125, -0.125]


# ---- fp16 loss scaling folded in: inv_scale and skip_if ----------------------------------------------------
SIZES = [4099, 1, 3, 4096, 257]


def views(device, half_dtype, seed, grad_scale=1.0, sizes=SIZES, poison_halves=True):
    """(masters, grads, halves) cut from flat buffers at odd offsets, so that some views are not vector-aligned.
    The same seed gives the same numbers. Halves: NaN poison (every element must be written) or random values
    unrelated to the masters (a skipped step must leave them as they are)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(sizes) + len(sizes)
    flat_master = torch.randn(total, device=device, generator=gen)
    flat_grad = torch.randn(total, device=device, generator=gen) * grad_scale
    flat_half = (torch.full((total,), float("nan"), device=device) if poison_halves
                 else torch.randn(total, device=device, generator=gen)).to(half_dtype)
    out, offset = ([], [], []), 1
    for n in sizes:
        for lst, flat in zip(out, (flat_master, flat_grad, flat_half)):
            lst.append(flat[offset:offset + n])
        offset += n + 1
    return out


def unscale_then_step(masters, grads, halves, lr, inv_scale):
    """The path the fused arguments replace: torch's AMP unscale in place, then the plain fused step."""
    found = torch.zeros(1, device=masters[0].device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), inv_scale, device=found.device))
    assert found.item() == 0.0
    _C.sgd_step_and_cast(masters, grads, halves, lr)


def inverse(scale: float) -> float:
    return float(torch.tensor(1.0 / scale, dtype=torch.float64).float())  # GradScaler's: fp64, then fp32


def assert_bits_equal(got, want):
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale", [65536.0, 1000.0, 3.0])
@pytest.mark.parametrize("with_flag", [False, True])
def test_inv_scale_is_torch_unscale_then_the_plain_step_bit_for_bit(device, half_dtype, scale, with_flag):
    inv = inverse(scale)
    want_m, want_g, want_h = views(device, half_dtype, 11, scale)
    unscale_then_step(want_m, want_g, want_h, 0.0625, inv)
    masters, grads, halves = views(device, half_dtype, 11, scale)
    scaled = [g.clone() for g in grads]
    flag = torch.zeros(1, device=device) if with_flag else None
    _C.sgd_step_and_cast(masters, grads, halves, 0.0625, inv_scale=inv, skip_if=flag)
    assert_bits_equal(masters, want_m)
    assert_bits_equal(halves, want_h)
    assert_bits_equal(grads, scaled)  # the gradients are read, never written: they stay scaled


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half_dtype", [torch.float16, torch.bfloat16])
def test_unit_inv_scale_and_a_clear_flag_are_the_plain_step(device, half_dtype):
    want_m, want_g, want_h = views(device, half_dtype, 12)
    _C.sgd_step_and_cast(want_m, want_g, want_h, 0.25)
    masters, grads, halves = views(device, half_dtype, 12)
    _C.sgd_step_and_cast(masters, grads, halves, 0.25, inv_scale=1.0, skip_if=torch.zeros(1, device=device))
    assert_bits_equal(masters, want_m)
    assert_bits_equal(halves, want_h)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half_dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("flag_value", [1.0, float("nan"), -2.0])
def test_a_set_flag_writes_nothing(device, half_dtype, flag_value):
    sizes = SIZES + [(1 << 20) + 12]  # several grid-stride rounds on the GPU
    masters, grads, halves = views(device, half_dtype, 13, 1000.0, sizes, poison_halves=False)
    grads[2][1] = float("inf")  # what set the flag
    before = [[t.clone() for t in ts] for ts in (masters, grads, halves)]
    _C.sgd_step_and_cast(masters, grads, halves, 0.5, inv_scale=inverse(1000.0),
                         skip_if=torch.full((1,), flag_value, device=device))
    for now, then in zip((masters, grads, halves), before):
        assert_bits_equal(now, then)


def strided(device, half_dtype, seed, grad_scale):
    """Transposed (non-contiguous) masters, grads and halves: the ATen path on every device."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = [(33, 17), (5, 4)]
    masters = [torch.randn(s, device=device, generator=gen).t() for s in shapes]
    grads = [(torch.randn(s, device=device, generator=gen) * grad_scale).t() for s in shapes]
    halves = [torch.randn(s, device=device, generator=gen).to(half_dtype).t() for s in shapes]
    return masters, grads, halves


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("half_dtype", [torch.float16, torch.bfloat16])
def test_strided_tensors_unscale_and_skip_alike(device, half_dtype):
    inv = inverse(1000.0)
    want_m, want_g, want_h = strided(device, half_dtype, 14, 1000.0)
    unscale_then_step(want_m, want_g, want_h, 0.125, inv)
    masters, grads, halves = strided(device, half_dtype, 14, 1000.0)
    _C.sgd_step_and_cast(masters, grads, halves, 0.125, inv_scale=inv, skip_if=torch.zeros(1, device=device))
    assert_bits_equal(masters, want_m)
    assert_bits_equal(halves, want_h)
    before = [[t.clone() for t in ts] for ts in (masters, halves)]
    _C.sgd_step_and_cast(masters, grads, halves, 0.125, inv_scale=inv, skip_if=torch.ones(1, device=device))
    assert_bits_equal(masters, before[0])
    assert_bits_equal(halves, before[1])


def test_master_weights_pass_inv_scale_and_skip_if():
    params = [torch.nn.Parameter(torch.randn(8, 4).half()), torch.nn.Parameter(torch.randn(4).half())]
    masters = MasterWeights(params)
    masters.masters[0].grad = torch.randn(8, 4) * 1024
    masters.masters[1].grad = torch.randn(4) * 1024
    before = [m.detach().clone() for m in masters.masters], [p.detach().clone() for p in params]
    masters.sgd_step_and_cast(0.25, inv_scale=1 / 1024, skip_if=torch.ones(1))
    assert_bits_equal([m.detach() for m in masters.masters], before[0])
    assert_bits_equal([p.detach() for p in params], before[1])
    masters.sgd_step_and_cast(0.25, inv_scale=1 / 1024, skip_if=torch.zeros(1))
    for m, b, p in zip(masters.masters, before[0], params):
        assert torch.equal(m.detach(), b - 0.25 * (m.grad / 1024))  # powers of two: every step exact
        assert torch.equal(p.detach(), m.detach().half())


def test_bad_skip_if_is_a_clear_value_error():
    args = ([torch.zeros(3)], [torch.zeros(3)], [torch.zeros(3, dtype=torch.half)], 0.1)
    with pytest.raises(ValueError, match="skip_if must be a float32 tensor of one element, got Double"):
        _C.sgd_step_and_cast(*args, skip_if=torch.zeros(1, dtype=torch.float64))
    with pytest.raises(ValueError, match="skip_if must be a float32 tensor of one element, got Float with 2"):
        _C.sgd_step_and_cast(*args, skip_if=torch.zeros(2))
    with pytest.raises(ValueError, match="skip_if is on meta but tensor 0 is on cpu"):
        _C.sgd_step_and_cast(*args, skip_if=torch.zeros(1, device="meta"))
    _C.sgd_step_and_cast(*args, skip_if=torch.zeros(()))  # any shape of one element will do


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_masters_with_a_cpu_flag_are_refused():
    args = ([torch.zeros(3, device="cuda")], [torch.zeros(3, device="cuda")],
            [torch.zeros(3, device="cuda", dtype=torch.half)], 0.1)
    with pytest.raises(ValueError, match="skip_if is on cpu but tensor 0 is on cuda"):
        _C.sgd_step_and_cast(*args, skip_if=torch.zeros(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("half_dtype", [torch.float16, torch.bfloat16])
def test_cuda_kernel_agrees_with_the_aten_path(half_dtype):
    # The same numbers through the kernel (contiguous views, some misaligned) and through ATen (copies with
    # stride 2): masters to fp32 rounding, halves to one rounding of the cast, as the tests above.
    def every_other(t):
        s = torch.empty(2 * t.numel(), device=t.device, dtype=t.dtype)[::2]
        return s.copy_(t)

    inv = inverse(1000.0)
    masters, grads, halves = views("cuda", half_dtype, 15, 1000.0)
    aten_m, aten_g, aten_h = ([every_other(t) for t in ts] for ts in (masters, grads, halves))
    assert not aten_m[0].is_contiguous()
    for m, g, h in ((masters, grads, halves), (aten_m, aten_g, aten_h)):
        _C.sgd_step_and_cast(m, g, h, 0.0625, inv_scale=inv, skip_if=torch.zeros(1, device="cuda"))
    for got, want in zip(masters, aten_m):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for got, want in zip(halves, aten_h):
        assert not got.isnan().any() and not want.isnan().any()
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-3)
