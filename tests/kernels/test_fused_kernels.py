"""The fused kernels' CPU path (hybrid_engine/kernels): each fused module computes what the module it replaces
computes (fp32, CPU: to 1e-5 or closer), RoPE at arbitrary positions, the chunked linear + cross-entropy equal to
the head's GEMM and the vocab-parallel loss (padding columns included) with the same gradients, a Llama trained
with the pass equal to one trained without, and the choice resolved and said as the run's options ask."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.kernels.elementwise import rms_norm, rope, rope_rows, swiglu
from hybrid_engine.kernels.linear_cross_entropy import linear_cross_entropy
from hybrid_engine.kernels.options import KernelOptions, resolve
from hybrid_engine.models.llama.config import apply_rope
from hybrid_engine.parallel.tensor.vocab_cross_entropy import vocab_parallel_cross_entropy

from hybrid_engine.kernels.apply import apply_kernels
from hybrid_engine.kernels.elementwise import FusedRMSNorm, FusedRotary, FusedSwiGLU
from hybrid_engine.kernels.linear_cross_entropy import LinearCrossEntropyHead
from hybrid_engine.models.llama.parallelize import build_llama
from kernel_models import config, train_one_process

pytestmark = pytest.mark.usefixtures("one_thread")
GEN = torch.Generator().manual_seed(0)


def _randn(*shape):
    return torch.randn(*shape, generator=GEN)


def test_rms_norm_and_swiglu_equal_the_unfused_ones():
    x, w = _randn(2, 5, 16), _randn(16)
    assert torch.allclose(rms_norm(x, w, 1e-5), F.rms_norm(x, (16,), w, 1e-5), rtol=1e-6, atol=1e-6)
    g, u = _randn(3, 7), _randn(3, 7)
    assert torch.allclose(swiglu(g, u), F.silu(g) * u, rtol=1e-6, atol=1e-6)


def test_rope_rotates_q_and_k_at_any_positions():
    q, k = _randn(2, 5, 4, 8), _randn(2, 5, 2, 8)
    cos_table, sin_table = _randn(12, 8), _randn(12, 8)
    positions = torch.tensor([7, 0, 11, 3, 4])  # not 0 .. s - 1: a context-parallel chunk's
    cos, sin = rope_rows(cos_table, sin_table, positions)
    fq, fk = rope(q, k, cos, sin)
    assert torch.equal(fq, apply_rope(q, cos_table[positions], sin_table[positions]))
    assert torch.equal(fk, apply_rope(k, cos_table[positions], sin_table[positions]))
    per_sequence = torch.stack([positions, positions.flip(0)])  # [b, s]: each sequence its own positions
    cos, sin = rope_rows(cos_table, sin_table, per_sequence)
    fq, _ = rope(q, k, cos, sin)
    assert torch.equal(fq[1], apply_rope(q[1:], cos_table[positions.flip(0)], sin_table[positions.flip(0)])[0])


@pytest.mark.parametrize("hidden", [16, 4])  # 10 tokens: the logit gradients kept (16), the fp32 accumulator (4)
@pytest.mark.parametrize("rows_per_chunk", [1, 3, 10, 64])
def test_linear_cross_entropy_equals_the_head_and_the_vocab_parallel_loss(rows_per_chunk, hidden):
    from hybrid_engine.kernels.linear_cross_entropy import keeps_logit_grads
    assert keeps_logit_grads(10, hidden) == (hidden == 16)
    x = _randn(2, 5, hidden).requires_grad_()
    weight = _randn(50, hidden).requires_grad_()  # 45 tokens padded to 50: the padding columns never count
    targets = torch.randint(0, 45, (2, 5), generator=GEN)
    fused = linear_cross_entropy(x, weight, targets, None, 45, chunk_bytes=4 * 50 * rows_per_chunk)
    fused_grads = torch.autograd.grad(fused * 3.0, (x, weight))
    plain = vocab_parallel_cross_entropy(x @ weight.t(), targets, None, 45)
    plain_grads = torch.autograd.grad(plain * 3.0, (x, weight))
    assert abs(fused.item() - plain.item()) <= 1e-6 * abs(plain.item())
    assert abs(plain.item() - F.cross_entropy((x @ weight.t())[..., :45].reshape(-1, 45), targets.reshape(-1))) < 1e-5
    for a, b in zip(fused_grads, plain_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # evaluation: the loss alone
        assert abs(linear_cross_entropy(x, weight, targets, None, 45).item() - plain.item()) <= 1e-6


def test_the_chunks_weight_gradient_adds_the_half_product_without_an_fp32_copy():
    """On the CPU the chunk's product is added in place as it is read: bit for bit the fp32 copy added."""
    from hybrid_engine.kernels.linear_cross_entropy import add_product
    a, b = _randn(40, 24).bfloat16(), _randn(24, 16).bfloat16()
    acc = _randn(40, 16)
    expected = acc + (a @ b).float()
    add_product(acc, a, b)
    assert torch.equal(acc, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_weight_gradient_accumulates_in_one_gemm_with_an_fp32_output():
    """cuBLAS adds the fp32 product into the accumulator: closer to the exact product than the bf16-rounded one."""
    from hybrid_engine.kernels.linear_cross_entropy import add_product
    a, b = _randn(512, 256).bfloat16().cuda(), _randn(256, 384).bfloat16().cuda()
    acc = _randn(512, 384).cuda()
    exact = acc.double() + a.double() @ b.double()
    rounded = acc + (a @ b).float()
    add_product(acc, a, b)
    assert (acc.double() - exact).abs().max() <= (rounded.double() - exact).abs().max()
    assert torch.allclose(acc.double(), exact, rtol=1e-5, atol=1e-4)


def test_a_llama_trained_with_the_fused_kernels_equals_one_trained_without():
    plain = train_one_process(KernelOptions(), 3, tied=True)
    fused = train_one_process(KernelOptions(fused=True), 3, tied=True)
    assert plain[-1] < plain[0]
    for a, b in zip(fused, plain):
        assert abs(a - b) <= 1e-5 * abs(b), (fused, plain)


def test_the_choice_follows_the_device_and_is_said():
    assert resolve("auto", False, "tensorwise", "cpu") == KernelOptions()  # no CUDA: auto is off
    auto = KernelOptions(fused=True, elementwise=False, compiled=True)  # auto on CUDA under tp: the loss only
    assert auto.describe() == ("fused kernels on (torch.compile'd Triton regions): chunked linear + cross-entropy; "
                               "RMSNorm, RoPE, SwiGLU unfused (auto: under tensor parallelism their compiled regions "
                               "measured a third slower at pp2 x tp2; --fused-kernels on fuses them); fp8 off")
    stage = apply_kernels(build_llama(config(tied=False, layers=2), "cpu"), auto)
    assert not any(isinstance(m, (FusedRMSNorm, FusedRotary, FusedSwiGLU)) for m in stage.modules())
    assert isinstance(stage[-1].lm_head, LinearCrossEntropyHead)
    on = resolve("on", True, "rowwise", "cpu")
    assert on == KernelOptions(fused=True, compiled=False, fp8="rowwise", fp8_native=False)
    assert on.describe() == ("fused kernels on (eager (no CUDA with Triton here)): RMSNorm, RoPE, SwiGLU, chunked "
                             "linear + cross-entropy; fp8 rowwise on the blocks' linear layers (e4m3 forward, e4m3 "
                             "gradients, dynamic scales; emulated: quantized, dequantized, fp32 GEMMs; weights "
                             "quantized once a step (cached: 2 bytes a block weight parameter); the LM head stays in "
                             "the weights' dtype)")
    assert resolve("on", True, "rowwise", "cpu", zero=3).describe().endswith(
        "weights quantized every micro-batch (auto: ZeRO-3 releases the gathered weights the cache would keep); the LM "
        "head stays in the weights' dtype)")
    assert not resolve("on", True, "rowwise", "cpu", fp8_weight_cache="off", zero=1).fp8_weight_cache
    with pytest.raises(ConfigError, match=r"^--fp8-weight-cache must be one of auto, on, off, got 'yes'$"):
        resolve("on", True, "rowwise", "cpu", fp8_weight_cache="yes")
    assert resolve("off", False, "tensorwise", "cpu").describe() == "fused kernels off; fp8 off"
    with pytest.raises(ConfigError, match=r"^--fused-kernels must be one of auto, on, off, got 'yes'$"):
        resolve("yes", False, "tensorwise", "cpu")
    with pytest.raises(ConfigError, match=r"^--fp8-recipe must be one of tensorwise, rowwise, got 'blockwise'$"):
        resolve("off", True, "blockwise", "cpu")


def test_the_pass_swaps_every_norm_rope_swiglu_and_the_head_keeping_the_parameter_names():
    from hybrid_engine.kernels.apply import apply_kernels
    from hybrid_engine.kernels.elementwise import FusedRMSNorm, FusedRotary, FusedSwiGLU
    from hybrid_engine.kernels.linear_cross_entropy import LinearCrossEntropyHead
    from hybrid_engine.models.llama.parallelize import build_llama

    from kernel_models import config

    plain = build_llama(config())
    names = [n for n, _ in plain.named_parameters()]
    fused = apply_kernels(build_llama(config()), KernelOptions(fused=True))
    kinds = [type(m) for m in fused.modules()]
    assert (kinds.count(FusedRMSNorm), kinds.count(FusedRotary), kinds.count(FusedSwiGLU),
            kinds.count(LinearCrossEntropyHead)) == (9, 4, 4, 1)
    assert [n for n, _ in fused.named_parameters()] == names
