"""fp8's quantization done once per operand (hybrid_engine/fp8): each of x, w and dy quantized in both layouts at
once, x kept for dw in fp8 (not in its own dtype), and the weights' forms cached once a step by the engine. Every
product is bit for bit what quantizing each GEMM's operands from scratch gives (the emulated path, exact on the
CPU), with fewer absolute maxima; the engine's cache is emptied where the weights change, so a run with it trains
and evaluates exactly what a run without it does."""
from __future__ import annotations

import pytest
import torch

from hybrid_engine.fp8 import quantize as quantize_module
from hybrid_engine.fp8.matmul import fp8_linear
from hybrid_engine.fp8.quantize import E4M3, E5M2, Quantizer, dequantize, quantize
from hybrid_engine.fp8.weight_cache import Fp8WeightCache

from dist_utils import run_ranks

pytestmark = pytest.mark.usefixtures("one_thread")


def per_gemm(x, w, dy, rowwise: bool):
    """Each GEMM's operands quantized from scratch along its contracted dimension, as the three GEMMs are defined."""
    g = E4M3 if rowwise else E5M2
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])

    def gemm(a, a_dim, a_dtype, b, b_dim, out_dtype):
        qa, sa = quantize(a, a_dtype, rowwise, a_dim)
        qb, sb = quantize(b, E4M3, rowwise, b_dim)
        return (dequantize(qa, sa) @ dequantize(qb, sb).t()).to(out_dtype)

    return (gemm(x2, 1, E4M3, w, 1, x.dtype).view(*x.shape[:-1], -1), gemm(dy2, 1, g, w, 0, x.dtype).view(x.shape),
            gemm(dy2, 0, g, x2, 0, w.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_quantizing_each_operand_once_is_bit_for_bit_the_per_gemm_quantization(recipe, dtype):
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 24, 32, generator=gen) * 3).to(dtype).requires_grad_()
    w = torch.randn(48, 32, generator=gen).to(dtype).requires_grad_()
    dy = torch.randn(2, 24, 48, generator=gen).to(dtype)
    expected = per_gemm(x.detach(), w.detach(), dy, recipe == "rowwise")
    cache = Fp8WeightCache()
    for weights in (None, cache, cache):  # no cache; the cache filled; the cache read
        y = fp8_linear(x, w, recipe, weights=weights)
        got = (y, *torch.autograd.grad(y, (x, w), dy))
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and torch.equal(a, b)
    assert len(cache) == 1 and cache.nbytes() >= 2 * w.numel()  # both layouts, 1 byte an element each


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_forward_keeps_x_for_dw_in_fp8_not_in_its_own_dtype(recipe):
    x = torch.randn(64, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(48, 32, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fp8_linear(x, w, recipe)
    activations = [t for t in saved if t is not w and t.numel() > 48]
    assert [(t.dtype, tuple(t.shape)) for t in activations] == [(E4M3, (32, 64))]  # x transposed, 1 byte each
    with torch.no_grad():  # no backward: nothing of x quantized for it
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            fp8_linear(x, w, recipe)
        assert saved == []


def test_tensorwise_reduces_one_maximum_per_operand_and_the_cached_weight_one_a_step(monkeypatch):
    calls = []
    real = quantize_module.local_amax
    monkeypatch.setattr(quantize_module, "local_amax", lambda t, dim: calls.append(tuple(t.shape)) or real(t, dim))
    quantizer = Quantizer()
    x = torch.randn(2, 16, 32, requires_grad=True)
    w = torch.randn(48, 32, requires_grad=True)
    for weights in (None, Fp8WeightCache()):
        calls.clear()
        for _ in range(2):  # two micro-batches of one step
            fp8_linear(x, w, "tensorwise", quantize=quantizer, weights=weights).sum().backward()
        # per micro-batch x and dy once each (the per-GEMM quantization: six); w twice a micro-batch, or once
        assert sorted(calls) == sorted([(32, 32), (32, 48)] * 2 + [(48, 32)] * (4 if weights is None else 1))


def test_a_weight_written_without_a_version_bump_needs_the_cache_emptied():
    cache, quantizer = Fp8WeightCache(), Quantizer()
    w = torch.randn(48, 32)
    make = lambda: quantizer.both(w, E4M3, False)  # noqa: E731
    first = cache.forms(w, False, make)
    w.data.mul_(2)  # as an all-gather into the parameters' buffer writes: no version bump
    assert cache.forms(w, False, make) is first  # stale: only emptying the cache tells
    cache.clear()
    assert torch.equal(cache.forms(w, False, make).last_scale, 2 * first.last_scale)
    with torch.no_grad():
        w.mul_(2)  # an in-place write autograd sees: the stamp catches it
    assert torch.equal(cache.forms(w, False, make).last_scale, 4 * first.last_scale)


def train(rank: int, world: int, variant: str) -> tuple[list[float], float]:
    from engine_builders import make_engine
    from hybrid_engine import ProcessGrid
    from hybrid_engine.engine.evaluate import evaluate
    from hybrid_engine.kernels.options import KernelOptions
    from hybrid_engine.models.llama.workload import llama_workload
    from hybrid_engine.optim import optimizers as optim
    from hybrid_engine.parallel.grid import build_groups

    from kernel_models import BATCH, LR, MICRO, MOMENTUM, config, dataset

    if variant in ("emptied only", "never emptied"):  # the stamp disabled: the engine's emptying alone
        Fp8WeightCache.stamp = staticmethod(lambda weight: (0, 0))
    if variant == "never emptied":
        Fp8WeightCache.clear = lambda self: None
    kernels = KernelOptions(fp8="tensorwise", fp8_weight_cache=variant != "off")
    workload = llama_workload(config(), dataset(), vocab_from_data=False, kernels=kernels)
    groups = build_groups(ProcessGrid(1, 1, 1), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=MICRO,
                         optimizer=optim.SGD(LR, MOMENTUM), **workload.engine_kwargs(1))
    losses = [engine.train_step(*workload.draw(step, 0, BATCH)).loss for step in range(3)]
    for p in engine.stages[0].parameters():  # a checkpoint load's write, unseen by autograd
        p.data.mul_(0.9)
    validation = evaluate(engine, *workload.draw(99, 0, BATCH), MICRO)
    cached = len(engine.fp8_weights)
    engine.close()
    groups.destroy()
    return losses, validation, cached


def test_the_engine_empties_its_weight_cache_where_the_weights_change():
    runs = {v: run_ranks(1, train, v, timeout=300)[0] for v in ("off", "on", "emptied only", "never emptied")}
    assert runs["off"][2] == 0 and runs["on"][2] > 0  # the cache held the blocks' weights
    assert runs["on"][:2] == runs["off"][:2] == runs["emptied only"][:2]  # bit for bit
    stale_losses, stale_validation, _ = runs["never emptied"]
    assert stale_losses[0] == runs["off"][0][0] and stale_losses[1:] != runs["off"][0][1:]
    assert stale_validation != runs["off"][1]
