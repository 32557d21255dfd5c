"""The fused SGD + cast of half-weights training (csrc/optim/sgd_cast.h) against torch.optim.SGD + copy.

The CPU path runs in CI; the CUDA kernel runs when a GPU is present (the GPU pass runs this file too)."""
import pytest
import torch

from hybrid_engine import _C
from hybrid_engine.engine import plain_sgd_lr
from hybrid_engine.precision import MasterWeights

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
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert plain_sgd_lr(torch.optim.SGD(p, lr=0.5)) == 0.5
    assert plain_sgd_lr(torch.optim.SGD(p, lr=0.5, momentum=0.9)) is None
    assert plain_sgd_lr(torch.optim.SGD(p, lr=0.5, weight_decay=1e-4)) is None
    assert plain_sgd_lr(torch.optim.Adam(p, lr=0.5)) is None
    sgd = torch.optim.SGD(p, lr=0.5)
    sgd.param_groups[0]["lr"] = 0.125  # what an LR scheduler does: the fused step must see it
    assert plain_sgd_lr(sgd) == 0.125
