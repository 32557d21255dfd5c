"""Sequence parallelism's C++ autograd functions (csrc/tp/sequence_region.h) against the chunk/cat reference, forward
and backward, on 2 and 4 gloo ranks. Every tensor holds small integers, so the sums are exact and the comparisons
are torch.equal."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks

from hybrid_engine.parallel.tensor import ops


def _ints(seed: int, *shape: int) -> torch.Tensor:
    """The same tensor on every rank that asks for `seed`."""
    return torch.randint(-8, 9, shape, generator=torch.Generator().manual_seed(seed)).float()


def _sequence_regions_match_chunk_and_cat(rank: int, world_size: int, b: int) -> dict:
    group = dist.new_group(list(range(world_size)))
    p, chunk, h = world_size, 3, (2, 5)  # trailing dims beyond the hidden one ride along
    s = p * chunk
    mine = lambda t: t.chunk(p, dim=1)[rank]  # noqa: E731 - this rank's sequence chunk

    # gather: [b, s/p, ...] chunks -> the whole sequence; backward: the sum over ranks of their gradients, my chunk.
    full = _ints(1, b, s, *h)
    x = mine(full).clone().requires_grad_(True)
    out = ops.gather_along_sequence(x, group)
    assert out.shape == full.shape and torch.equal(out, full)
    grads = [_ints(100 + r, b, s, *h) for r in range(p)]
    out.backward(grads[rank])
    assert torch.equal(x.grad, mine(sum(grads)))

    # reduce-scatter: per-rank partial sums -> my chunk of their sum; backward: every rank's gradient, in rank order.
    partials = [_ints(200 + r, b, s, *h) for r in range(p)]
    y = partials[rank].clone().requires_grad_(True)
    out = ops.reduce_scatter_along_sequence(y, group)
    assert torch.equal(out, mine(sum(partials)))
    grads = [_ints(300 + r, b, chunk, *h) for r in range(p)]
    out.backward(grads[rank])
    assert torch.equal(y.grad, torch.cat(grads, dim=1))

    # scatter: a replicated tensor -> my chunk; backward: every rank's gradient, in rank order.
    z = _ints(2, b, s, *h).requires_grad_(True)
    out = ops.scatter_along_sequence(z, group)
    assert torch.equal(out, mine(z.detach()))
    grads = [_ints(400 + r, b, chunk, *h) for r in range(p)]
    out.backward(grads[rank])
    assert torch.equal(z.grad, torch.cat(grads, dim=1))

    # An expanded gradient (what .sum() hands back) goes through the gather's reduce-scatter as well.
    x = mine(full).clone().requires_grad_(True)
    ops.gather_along_sequence(x, group).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, float(p)))

    # A sequence that does not split raises ValueError on every rank, before any collective.
    for fn in (ops.reduce_scatter_along_sequence, ops.scatter_along_sequence):
        with pytest.raises(ValueError, match=f"sequence length {s + 1} is not divisible by the model-parallel "
                                             f"size {p}"):
            fn(_ints(3, b, s + 1, *h), group)
    return {"ok": True}


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("b", [1, 3])
def test_sequence_regions_match_chunk_and_cat(p, b):
    results = run_ranks(p, _sequence_regions_match_chunk_and_cat, b, timeout=60)
    assert all(r.get("ok") for r in results[:p])


def test_sequence_regions_are_the_identity_without_a_group():
    x = torch.ones(2, 4, 3, requires_grad=True)
    for fn in (ops.gather_along_sequence, ops.reduce_scatter_along_sequence, ops.scatter_along_sequence):
        assert fn(x, None) is x
