"""Tensor-parallel autograd (C++) and layers: exact on one process, equal to the dense model on 2 and 4 ranks.

One process: `ops.linear` is nn.Linear bit for bit; deferred weight gradients (zero-bubble W) flushed later equal
the ordinary backward's, bit for bit for one micro-batch and to rounding over several; the merged flush (one GEMM
for several micro-batches) likewise. Gloo ranks: the region functions sum exactly once each way, and a
parallelized MLP (even and odd depth) reproduces the dense model's outputs, input gradients and weight gradients.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_ranks
from torch import nn

from hybrid_engine import _C
from hybrid_engine.parallel.tensor import ops
from hybrid_engine.parallel.tensor.layers import ColumnParallelLinear, Linear, RowParallelLinear, is_mp_split, parallelize_mlp

DIM = 16
ROWS = 8


@pytest.fixture
def grads():
    """A fresh gradient buffer, as an Engine owns one: the deferred weight gradients live in it, not in the process."""
    return _C.GradBuffer()


def _route(module: nn.Module, grads) -> nn.Module:
    """Hand `grads` to every layer of `module`, as an Engine does with its own buffer."""
    for m in module.modules():
        if hasattr(m, "grad_buffer"):
            m.grad_buffer = grads
    return module


def _mlp(depth: int, seed: int = 0, dim: int = DIM) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i in range(depth):
        layers.append(nn.Linear(dim, dim))
        if i < depth - 1:
            layers.append(nn.GELU() if i % 2 else nn.ReLU())
    return nn.Sequential(*layers)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max-norm relative error of a against the reference b."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _run(model: nn.Module, x: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.detach().clone().requires_grad_(True)
    y = model(x)
    (y * upstream).sum().backward()
    return y.detach(), x.grad


# ------------------------------------------------------------------------------------------------ one process


@pytest.mark.parametrize("shape", [(ROWS, DIM), (2, 3, DIM), (1, DIM)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_nn_linear_bit_for_bit(shape, bias):
    torch.manual_seed(1)
    dense = nn.Linear(DIM, 12, bias=bias)
    ours = Linear.from_dense(dense)
    x = torch.randn(shape)
    upstream = torch.randn(*shape[:-1], 12)
    y_ref, gx_ref = _run(dense, x, upstream)
    y, gx = _run(ours, x, upstream)
    assert torch.equal(y, y_ref)
    assert torch.equal(gx, gx_ref)
    assert torch.equal(ours.weight.grad, dense.weight.grad)
    if bias:
        assert torch.equal(ours.bias.grad, dense.bias.grad)
    assert ours.weight.mp_split is False


def test_linear_default_init_equals_nn_linear_under_the_same_seed():
    torch.manual_seed(5)
    dense = nn.Linear(DIM, 12)
    torch.manual_seed(5)
    ours = Linear(DIM, 12)
    assert torch.equal(ours.weight, dense.weight) and torch.equal(ours.bias, dense.bias)


def test_deferred_weight_grads_one_micro_batch_are_bit_identical(grads):
    dense = parallelize_mlp(_mlp(3), None)
    deferred = _route(copy.deepcopy(dense), grads)
    x, upstream = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    _, gx_ref = _run(dense, x, upstream)

    grads.set_defer(True)
    grads.begin(0, 0)
    _, gx = _run(deferred, x, upstream)
    grads.set_defer(False)
    assert torch.equal(gx, gx_ref), "the input gradient (I) must not wait for W"
    assert all(p.grad is None for p in deferred.parameters())
    assert grads.pending == 3  # one stash per Linear

    updated = grads.flush(0, 0)
    assert grads.pending == 0
    assert len(updated) == 6 and all(any(u is p for p in deferred.parameters()) for u in updated)
    for p_ref, p in zip(dense.parameters(), deferred.parameters()):
        assert p.grad.dtype == p_ref.grad.dtype and p.grad.stride() == p_ref.grad.stride()
        assert torch.equal(p.grad, p_ref.grad)


def _micro_batches(n: int, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ROWS, DIM, generator=g), torch.randn(ROWS, DIM, generator=g)) for _ in range(n)]


@pytest.mark.parametrize("merged", [False, True], ids=["flush_each", "flush_merged"])
def test_deferred_weight_grads_over_micro_batches_match_autograd_accumulation(merged, grads):
    dense = parallelize_mlp(_mlp(4), None)
    deferred = _route(copy.deepcopy(dense), grads)
    batches = _micro_batches(4)
    for x, upstream in batches:
        _run(dense, x, upstream)

    grads.set_defer(True)
    for micro, (x, upstream) in enumerate(batches):
        grads.begin(0, micro)
        _run(deferred, x, upstream)
    grads.set_defer(False)
    assert grads.pending == 4 * 4
    if merged:
        grads.flush_merged([(0, m) for m in range(len(batches))])
    else:
        for micro in range(len(batches)):  # W actions may run in any order relative to each other
            grads.flush(0, micro)
    assert grads.pending == 0
    for p_ref, p in zip(dense.parameters(), deferred.parameters()):
        if merged:
            assert _rel_err(p.grad, p_ref.grad) < 1e-5
        else:
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-6, atol=1e-6)


def test_flush_merged_of_one_key_is_bit_identical_and_accumulates_onto_existing_grads(grads):
    layer = Linear(DIM, 12)
    twin = _route(copy.deepcopy(layer), grads)
    x, up = torch.randn(ROWS, DIM), torch.randn(ROWS, 12)
    _run(layer, x, up)
    grads.set_defer(True)
    grads.begin(1, 7)
    _run(twin, x, up)
    grads.set_defer(False)
    grads.flush_merged([(1, 7)])
    assert torch.equal(twin.weight.grad, layer.weight.grad) and torch.equal(twin.bias.grad, layer.bias.grad)
    # A second flush adds to the existing .grad in place (no new tensor), as AccumulateGrad does.
    grad_before = twin.weight.grad
    grads.set_defer(True)
    grads.begin(1, 8)
    _run(twin, x, up)
    grads.set_defer(False)
    grads.flush_all()
    assert twin.weight.grad is grad_before
    torch.testing.assert_close(twin.weight.grad, 2 * layer.weight.grad, rtol=1e-6, atol=1e-6)


def test_flush_of_unknown_key_is_a_noop_and_keys_stay_separate(grads):
    layer = _route(Linear(DIM, DIM), grads)
    grads.set_defer(True)
    for micro in range(2):
        grads.begin(0, micro)
        _run(layer, *_micro_batches(1, seed=micro)[0])
    grads.set_defer(False)
    assert grads.flush(5, 5) == []
    assert grads.pending == 2
    grads.flush(0, 1)
    assert grads.pending == 1


def test_deferring_without_a_key_raises(grads):
    layer = _route(Linear(DIM, DIM), grads)
    grads.set_defer(True)
    grads.end()
    with pytest.raises(RuntimeError, match="begin"):
        _run(layer, *_micro_batches(1)[0])


def test_non_leaf_weight_gets_its_gradient_immediately(grads):
    weight = nn.Parameter(torch.randn(12, DIM))
    x = torch.randn(ROWS, DIM, requires_grad=True)
    grads.set_defer(True)
    grads.begin(0, 0)
    ops.linear(x, weight * 2.0, None, grads).sum().backward()
    grads.set_defer(False)
    assert grads.pending == 0
    assert weight.grad is not None


def test_linear_under_cpu_autocast_computes_in_bf16_and_reaches_fp32_params():
    dense = nn.Linear(DIM, 12)
    ours = Linear.from_dense(dense)
    x = torch.randn(ROWS, DIM)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = dense(x)
        y = ours(x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, y_ref)
    y.float().sum().backward()
    y_ref.float().sum().backward()
    assert ours.weight.grad.dtype == torch.float32
    assert torch.equal(ours.weight.grad, dense.weight.grad)


def test_regions_are_identity_without_a_group():
    x = torch.randn(3, 4)
    for fn in (ops.copy_to_mp_region, ops.reduce_from_mp_region, ops.gather_from_mp_region):
        assert fn(x, None) is x


def test_parallelize_mlp_without_group_uses_deferrable_linear_everywhere():
    seq = _mlp(3)
    out = parallelize_mlp(seq, None)
    assert [type(m) for m in out] == [Linear, nn.ReLU, Linear, nn.GELU, Linear]
    assert [n for n, _ in out.named_children()] == [n for n, _ in seq.named_children()]
    assert all(not is_mp_split(p) for p in out.parameters())
    x, up = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    assert torch.equal(_run(out, x, up)[0], _run(seq, x, up)[0])


# ------------------------------------------------------------------------------------------------ gloo ranks


def _regions_sum_exactly_once(rank: int, world_size: int) -> None:
    group = dist.new_group(list(range(world_size)))
    assert tuple(_C.group_rank_and_size(group)) == (rank, world_size)
    total = world_size * (world_size + 1) / 2  # sum of (r + 1) over ranks

    # copy_to: forward identity; backward sums each rank's upstream gradient once.
    x = torch.ones(3, requires_grad=True)
    y = ops.copy_to_mp_region(x, group)
    assert torch.equal(y, x)
    (y * (rank + 1)).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), total)), x.grad

    # reduce_from: forward sums once; backward passes the rank's own upstream gradient through unchanged.
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    y = ops.reduce_from_mp_region(x, group)
    assert torch.equal(y, torch.full((3,), total)), y
    assert torch.equal(x, torch.full((3,), float(rank + 1))), "the forward sum must not write into its input"
    (y * (rank + 1)).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), float(rank + 1)))

    # gather: rank order along the last dim; backward takes this rank's slice.
    x = torch.full((2, 3), float(rank), requires_grad=True)
    y = ops.gather_from_mp_region(x, group)
    assert y.shape == (2, 3 * world_size)
    for r in range(world_size):
        assert torch.equal(y[:, 3 * r:3 * (r + 1)], torch.full((2, 3), float(r)))
    weights = torch.arange(3.0 * world_size).expand(2, -1)
    (y * weights).sum().backward()
    assert torch.equal(x.grad, weights[:, 3 * rank:3 * (rank + 1)])


def _gather_param(p: torch.Tensor, dim: int, group) -> torch.Tensor:
    parts = [torch.empty_like(p) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, p.contiguous(), group=group)
    return torch.cat(parts, dim)


def _compare_grads_with_dense(par: nn.Sequential, dense: nn.Sequential, group, tol: float) -> None:
    for (name, layer), (_, ref) in zip(par.named_children(), dense.named_children()):
        if isinstance(layer, ColumnParallelLinear):
            weight, bias = _gather_param(layer.weight.grad, 0, group), _gather_param(layer.bias.grad, 0, group)
        elif isinstance(layer, RowParallelLinear):
            weight, bias = _gather_param(layer.weight.grad, 1, group), layer.bias.grad
            # Replicated bias: every MP rank holds the same gradient.
            assert torch.equal(_gather_param(bias, 0, group), bias.repeat(dist.get_world_size(group)))
        else:
            continue
        assert _rel_err(weight, ref.weight.grad) < tol, f"{name} weight grad"
        assert _rel_err(bias, ref.bias.grad) < tol, f"{name} bias grad"


def _parallel_mlp_matches_dense(rank: int, world_size: int, depth: int) -> dict:
    group = dist.new_group(list(range(world_size)))
    dense = _mlp(depth)  # same seed on every rank: weights depend on the dense model only
    par = parallelize_mlp(dense, group)
    kinds = [type(m).__name__ for m in par if not isinstance(m, (nn.ReLU, nn.GELU))]
    for layer in par:
        if isinstance(layer, ColumnParallelLinear):
            assert is_mp_split(layer.weight) and is_mp_split(layer.bias)
        if isinstance(layer, RowParallelLinear):
            assert is_mp_split(layer.weight) and not is_mp_split(layer.bias)

    torch.manual_seed(100)  # same data everywhere, as DP-replicas-of-one MP group see it
    x, upstream = torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)
    y_ref, gx_ref = _run(dense, x, upstream)
    y, gx = _run(par, x, upstream)
    assert _rel_err(y, y_ref) < 1e-5, "forward"
    # The input gradient goes through one backward all-reduce (the first pair's copy_to); two would give
    # world_size times it, none a partial sum.
    assert _rel_err(gx, gx_ref) < 1e-5, f"input grad off by {(gx / gx_ref).median().item():.3f}x"
    _compare_grads_with_dense(par, dense, group, 1e-5)

    # The zero-bubble split: I now, W at flush; same gradients on the tensor-parallel layers.
    grads = _C.GradBuffer()
    zb = _route(parallelize_mlp(dense, group), grads)
    grads.set_defer(True)
    grads.begin(0, 0)
    _, gx_zb = _run(zb, x, upstream)
    grads.set_defer(False)
    assert torch.equal(gx_zb, gx)
    assert grads.pending == depth
    grads.flush(0, 0)
    for p_ref, p in zip(par.parameters(), zb.parameters()):
        assert torch.equal(p.grad, p_ref.grad)
    return {"kinds": kinds}


@pytest.mark.parametrize("world_size", [2, 4])
def test_mp_regions_reduce_exactly_once_each_way(world_size):
    run_ranks(world_size, _regions_sum_exactly_once, timeout=60)


@pytest.mark.parametrize("world_size,depth", [(2, 4), (2, 5), (4, 4), (4, 5)])
def test_parallel_mlp_matches_dense_model(world_size, depth):
    results = run_ranks(world_size, _parallel_mlp_matches_dense, depth, timeout=60)
    kinds = results[0]["kinds"]
    expected = ["ColumnParallelLinear", "RowParallelLinear"] * (depth // 2)
    if depth % 2:
        expected.append("ColumnParallelLinear")  # the lone last layer, gathered
    assert kinds == expected


def _construction_checks(rank: int, world_size: int) -> None:
    group = dist.new_group(list(range(world_size)))
    seq = nn.Sequential(nn.Linear(DIM, DIM), nn.LayerNorm(DIM), nn.Linear(DIM, DIM))
    with pytest.raises(ValueError, match="LayerNorm"):
        parallelize_mlp(seq, group)
    with pytest.raises(ValueError, match="out_features 5 is not divisible by the model-parallel size"):
        ColumnParallelLinear(DIM, 5, group)
    # Built directly, a parallel layer is its rank's slice of nn.Linear's initialisation under the same seed.
    shard = DIM // world_size
    torch.manual_seed(9)
    dense = nn.Linear(DIM, DIM)
    torch.manual_seed(9)
    column = ColumnParallelLinear(DIM, DIM, group)
    torch.manual_seed(9)
    row = RowParallelLinear(DIM, DIM, group)
    assert torch.equal(column.weight, dense.weight[rank * shard:(rank + 1) * shard])
    assert torch.equal(column.bias, dense.bias[rank * shard:(rank + 1) * shard])
    assert torch.equal(row.weight, dense.weight[:, rank * shard:(rank + 1) * shard])
    assert torch.equal(row.bias, dense.bias)


def test_parallel_layers_validate_and_slice_the_dense_initialisation():
    run_ranks(2, _construction_checks, timeout=60)
