"""fp8's quantization kernels on a GPU (hybrid_engine/fp8/gpu_cast.py) give, bit for bit, what the eager functions
of quantize.py give: both layouts and each alone, tensor-wise and row-wise, e4m3 and e5m2, shapes that are not
multiples of the kernel's tile, a transposed (non-contiguous) input and an all-zero one."""
from __future__ import annotations

import pytest
import torch

from hybrid_engine.fp8.quantize import E4M3, E5M2, Quantizer
from hybrid_engine.kernels.options import has_triton

pytestmark = pytest.mark.skipif(not has_triton(), reason="needs a CUDA GPU with Triton")

SHAPES = [(4096, 1024), (100, 77), (1, 64), (333, 4100)]


def operand(shape, kind: str) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(sum(shape))
    t = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) * 3
    t[0, 0] = 700.0  # beyond e4m3's range once scaled by another row's maximum: the clamp matters row-wise
    if kind == "transposed":
        return t.t().contiguous().t()
    return torch.zeros_like(t) if kind == "zeros" else t


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and bits (fp8 compared as bytes)."""
    bits = (lambda t: t.view(torch.uint8)) if a.element_size() == 1 else (lambda t: t)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["plain", "transposed", "zeros"])
@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_the_kernels_quantize_as_the_eager_functions(shape, kind, rowwise, dtype):
    t = operand(shape, kind)
    gpu, eager = Quantizer(gpu_kernels=True), Quantizer()
    got, want = gpu.both(t, dtype, rowwise), eager.both(t, dtype, rowwise)
    assert gpu._kernels is not None  # the kernels ran, not the fallback
    for name, a, b in zip(got._fields, got, want):
        assert same(a, b), (name, shape, kind, rowwise, dtype)
    for contracted in (0, 1):
        for a, b in zip(gpu(t, dtype, rowwise, contracted), eager(t, dtype, rowwise, contracted)):
            assert same(a, b), (contracted, shape, kind, rowwise, dtype)
    if not rowwise:  # one scale: the second layout is the first's transpose
        assert torch.equal(got.first.t().view(torch.uint8), got.last.view(torch.uint8))
