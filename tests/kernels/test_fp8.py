"""fp8 training's CPU path (hybrid_engine/fp8): the quantization (saturating casts, scales from absolute maxima,
tensor-wise or along a dimension), the emulated GEMMs against torch._scaled_mm's (the native path's conventions:
operand layouts and scales, run here on the CPU), gradients close to fp32's, a tiny Llama that learns in fp8 and
stays close to its unquantized twin, and the refusal on a card without fp8."""
from __future__ import annotations

import pytest
import torch

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.fp8.matmul import fp8_linear
from hybrid_engine.fp8.quantize import E4M3, E5M2, dequantize, quantize
from hybrid_engine.kernels import options as kernel_options
from hybrid_engine.kernels.options import KernelOptions, resolve

from kernel_models import train_one_process

pytestmark = pytest.mark.usefixtures("one_thread")


def _rel(a, b) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


def test_quantize_scales_to_the_formats_range_and_saturates():
    t = torch.tensor([[1.0, -3.0, 0.5], [0.0, 0.0, 0.0]])
    q, scale = quantize(t, E4M3, False, 1)
    assert q.dtype == E4M3 and scale.shape == () and scale.item() == pytest.approx(3.0 / 448)
    assert q.float().abs().max().item() == 448.0  # the largest value maps onto the format's largest
    rows, row_scales = quantize(t, E5M2, True, 1)
    assert row_scales.shape == (2, 1) and rows.float()[1].abs().max().item() == 0.0  # a zero row stays zero
    assert torch.allclose(dequantize(rows, row_scales)[0], t[0], rtol=0.13)  # e5m2: 2 mantissa bits
    cols, col_scales = quantize(t, E4M3, True, 0)  # contracted along dimension 0: quantized transposed
    assert cols.shape == (3, 2) and cols.is_contiguous() and col_scales.shape == (3, 1)
    assert torch.allclose(dequantize(cols, col_scales), t.t(), rtol=0.07)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_emulation_is_the_scaled_mm_product_and_close_to_fp32(recipe):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=gen).requires_grad_()
    w = torch.randn(48, 32, generator=gen).requires_grad_()
    dy = torch.randn(64, 48, generator=gen)
    runs = []
    for native in (False, True):
        y = fp8_linear(x, w, recipe, native=native)
        runs.append((y, *torch.autograd.grad(y, (x, w), dy)))
    exact = (x @ w.t(), dy @ w, dy.t() @ x)
    for emulated, native, fp32 in zip(runs[0], runs[1], exact):
        assert _rel(emulated, native) < 1e-2  # the same quantization; _scaled_mm rounds its product to bf16
        assert _rel(emulated, fp32) < 0.1  # e4m3: 3 mantissa bits, e5m2 gradients: 2


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_llama_learns_in_fp8_close_to_its_unquantized_twin(recipe):
    steps = dict(steps=12, lr=0.05, momentum=0.9, layers=2)
    plain = train_one_process(KernelOptions(), **steps)
    fp8 = train_one_process(KernelOptions(fp8=recipe), **steps)
    assert fp8[-1] < 0.8 * fp8[0], fp8
    assert all(abs(a - b) <= 0.02 * b for a, b in zip(fp8, plain)), (fp8, plain)
    assert fp8 != plain  # the GEMMs were quantized


def test_fp8_on_a_card_without_it_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(kernel_options.torch.cuda, "get_device_capability", lambda: (8, 0))
    monkeypatch.setattr(kernel_options.torch.cuda, "get_device_name", lambda: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(kernel_options, "has_triton", lambda: True)
    with pytest.raises(ConfigError, match=r"^--fp8 needs a card with fp8 tensor cores \(compute capability 8\.9 or "
                                          r"later\); NVIDIA A100-SXM4-80GB has 8\.0$"):
        resolve("auto", True, "tensorwise", "cuda")
    assert resolve("auto", False, "tensorwise", "cuda") == KernelOptions(fused=True, compiled=True)
    # under tensor parallelism auto fuses the loss only; on fuses everything anywhere
    assert resolve("auto", False, "tensorwise", "cuda", mp=2) == KernelOptions(fused=True, elementwise=False,
                                                                                compiled=True)
    assert resolve("on", False, "tensorwise", "cuda", mp=2) == KernelOptions(fused=True, compiled=True)
    monkeypatch.setattr(kernel_options.torch.cuda, "get_device_capability", lambda: (9, 0))
    assert resolve("off", True, "rowwise", "cuda") == KernelOptions(compiled=True, fp8="rowwise", fp8_native=True)


@pytest.mark.parametrize("model", ["llama", "gpt"])
def test_the_models_check_refuses_fp8_on_such_a_card_before_anything_is_built(model, monkeypatch):
    from hybrid_engine import ProcessGrid
    from hybrid_engine.config.flags import parse_config
    from hybrid_engine.models import registry

    monkeypatch.setattr(kernel_options.torch.cuda, "get_device_capability", lambda: (7, 0))
    monkeypatch.setattr(kernel_options.torch.cuda, "get_device_name", lambda: "Tesla V100")
    cfg = parse_config(["--model", model, "--fp8", "--layers", "2"], registry.options())
    with pytest.raises(ConfigError, match=r"^--fp8 needs a card with fp8 tensor cores .*; Tesla V100 has 7\.0$"):
        registry.check_model(cfg, ProcessGrid(1, 1, 1), "cuda")
    registry.check_model(cfg, ProcessGrid(1, 1, 1), "cpu")  # emulated on the CPU
