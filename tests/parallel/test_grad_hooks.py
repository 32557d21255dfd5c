"""The GradBuffer's C++ post-accumulate hooks (csrc/grad/grad_hooks.h): once autograd has summed a parameter's
gradient of one backward, a routed parameter's gradient is added to its fp32 main grad and param.grad is reset; an
unrouted one keeps its .grad. A Python hook already on the parameter still runs; a buffer built again over the
same parameters takes them over; the hooks never keep a buffer alive. The addition (_C.add_into) equals add_ bit
for bit, on a GPU through its vectorized kernel too."""
from __future__ import annotations

import gc

import pytest
import torch

from hybrid_engine import _C


def _backward(*params: torch.Tensor) -> None:
    sum((p * (i + 1)).sum() for i, p in enumerate(params)).backward()


def test_routed_gradient_goes_to_its_main_grad_and_leaves_no_grad():
    half = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    plain = torch.nn.Parameter(torch.ones(3))
    main = torch.full((4,), 0.5)
    grads = _C.GradBuffer([main])
    grads.set_main_grad(half, main)
    grads.install_grad_hooks([half, plain])
    _backward(half, plain)
    _backward(half, plain)  # a second micro-batch sums in fp32
    assert half.grad is None
    assert torch.equal(main, torch.full((4,), 2.5))
    assert torch.equal(plain.grad, torch.full((3,), 4.0))


def test_an_earlier_python_hook_still_runs_first():
    param = torch.nn.Parameter(torch.ones(2))
    main = torch.zeros(2)
    seen = []
    param.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    grads = _C.GradBuffer([main])
    grads.set_main_grad(param, main)
    grads.install_grad_hooks([param])
    _backward(param)
    assert len(seen) == 1 and torch.equal(seen[0], torch.ones(2))
    assert param.grad is None and torch.equal(main, torch.ones(2))


def test_a_new_buffer_takes_the_parameters_over():
    param = torch.nn.Parameter(torch.ones(2))
    old_main, new_main = torch.zeros(2), torch.zeros(2)
    old = _C.GradBuffer([old_main])
    old.set_main_grad(param, old_main)
    old.install_grad_hooks([param])
    new = _C.GradBuffer([new_main])
    new.set_main_grad(param, new_main)
    new.install_grad_hooks([param])
    _backward(param)
    assert torch.equal(old_main, torch.zeros(2)) and torch.equal(new_main, torch.ones(2))


def test_hooks_hold_their_buffer_weakly():
    """The buffer holds its routed parameters, the parameters hold the hooks: a strong reference back would keep
    both alive forever. Once the buffer is gone, the hook does nothing."""
    param = torch.nn.Parameter(torch.ones(2))
    main = torch.zeros(2)
    grads = _C.GradBuffer([main])
    grads.set_main_grad(param, main)
    grads.install_grad_hooks([param])
    del grads
    gc.collect()
    _backward(param)
    assert torch.equal(main, torch.zeros(2)) and torch.equal(param.grad, torch.ones(2))


def _add_into_cases(device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        for n, offset in ((4099, 0), (4099, 1), (1 << 20, 0), (3, 0)):  # a tail, misaligned views, vectors only
            target = torch.randn(n + offset, device=device, generator=gen) * 1e3
            grad = torch.randn(n + offset, device=device, generator=gen).to(dtype)
            yield target[offset:], grad[offset:]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_add_into_equals_add_bit_for_bit(device):
    for target, grad in _add_into_cases(device):
        want = target.clone().add_(grad)
        _C.add_into(target, grad)
        assert torch.equal(target, want), (grad.dtype, grad.numel(), grad.storage_offset())
    same = torch.ones(5, device=device)  # same dtypes: add_
    _C.add_into(same, torch.full((5,), 2.0, device=device))
    assert torch.equal(same, torch.full((5,), 3.0, device=device))
