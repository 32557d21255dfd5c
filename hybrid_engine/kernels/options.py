"""Which run gets fused kernels and fp8 GEMMs: the user's --fused-kernels (auto | on | off) and --fp8 (with its
--fp8-recipe) resolved against the device once, before anything is built, and said in one line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from hybrid_engine.config.engine import ConfigError

FUSED_MODES = ("auto", "on", "off")
FP8_RECIPES = ("tensorwise", "rowwise")
FP8_WEIGHT_CACHE_MODES = ("auto", "on", "off")
# Why auto leaves fp8's weight cache off under ZeRO-3: its forms (2 bytes a parameter) would keep whole what ZeRO-3
# releases after each layer.
AUTO_WEIGHT_CACHE_WHY = "auto: ZeRO-3 releases the gathered weights the cache would keep"
FP8_CAPABILITY = (8, 9)  # Ada and Hopper: the first cards with fp8 tensor cores (torch._scaled_mm)
# Why auto leaves the elementwise modules unfused under tensor parallelism: measured on H200s (docs/kernels.md), the
# compiled RMSNorm, RoPE and SwiGLU regions cost a Llama-1B about a third of its step at pp2 x tp2, while without
# tensor parallelism they cost nothing measurable (one GPU) and save memory (SwiGLU keeps 3 of its 4 ffn tensors).
AUTO_ELEMENTWISE_WHY = "auto: under tensor parallelism their compiled regions measured a third slower at pp2 x tp2"


def has_triton() -> bool:
    """Whether torch.compile can write Triton kernels here (a CUDA device and the Triton package)."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch.utils._triton import has_triton as torch_has_triton
    except ImportError:
        return False
    return torch_has_triton()


@dataclass(frozen=True)
class KernelOptions:
    """The resolved choice: `fused` swaps in the chunked linear + cross-entropy and, with `elementwise`, the fused
    RMSNorm, RoPE and SwiGLU; `compiled` makes each a torch.compile'd region and runs fp8's quantization as
    Triton kernels (CUDA with Triton), `fp8` names the recipe of the blocks' fp8 GEMMs (None: no fp8),
    `fp8_native` runs them through torch._scaled_mm (a card with fp8) instead of the emulation (quantize,
    dequantize, fp32 GEMM), `fp8_weight_cache` quantizes each weight once a step into the engine's Fp8WeightCache
    (fp8/weight_cache.py) instead of once a micro-batch, `fp8_cache_why` says why it is off when it is."""

    fused: bool = False
    elementwise: bool = True
    compiled: bool = False
    fp8: Optional[str] = None
    fp8_native: bool = False
    fp8_weight_cache: bool = True
    fp8_cache_why: str = ""

    @property
    def any(self) -> bool:
        return self.fused or self.fp8 is not None

    def describe(self, elementwise: str = "RMSNorm, RoPE, SwiGLU", note: str = "") -> str:
        """The one line a run prints of this choice (elementwise: the model's modules the elementwise fusions
        cover, "" for none; note: what the model says of its own kernels)."""
        if self.fused:
            how = "torch.compile'd Triton regions" if self.compiled else "eager (no CUDA with Triton here)"
            parts = f"{elementwise}, chunked linear + cross-entropy" if elementwise and self.elementwise else (
                "chunked linear + cross-entropy")
            fused = f"fused kernels on ({how}): {parts}{f' {note}' if note else ''}"
            if elementwise and not self.elementwise:
                fused += (f"; {elementwise} unfused ({AUTO_ELEMENTWISE_WHY}; --fused-kernels on fuses them)")
        else:
            fused = "fused kernels off"
        if self.fp8 is None:
            return f"{fused}; fp8 off"
        grads = "e5m2" if self.fp8 == "tensorwise" else "e4m3"
        how = "torch._scaled_mm" if self.fp8_native else "emulated: quantized, dequantized, fp32 GEMMs"
        how += ", quantized by Triton kernels" if self.compiled else ""
        cache = ("weights quantized once a step (cached: 2 bytes a block weight parameter)" if self.fp8_weight_cache
                 else f"weights quantized every micro-batch ({self.fp8_cache_why or '--fp8-weight-cache off'})")
        return (f"{fused}; fp8 {self.fp8} on the blocks' linear layers (e4m3 forward, {grads} gradients, dynamic "
                f"scales; {how}; {cache}; the LM head stays in the weights' dtype)")


def resolve(fused_kernels: str, fp8: bool, fp8_recipe: str, device_type: str, card: str | None = None,
            mp: int = 1, fp8_weight_cache: str = "auto", zero: int = 0) -> KernelOptions:
    """The run's KernelOptions on `device_type` ("cuda" or "cpu"); ConfigError (one line) for a bad choice or fp8
    on a card without it. auto: the chunked linear + cross-entropy where CUDA and Triton are (its eager form
    elsewhere equals the unfused model, at the unfused model's speed), the elementwise modules too unless the
    layers are split over mp > 1 tensor-parallel ranks (AUTO_ELEMENTWISE_WHY). card: a Hopper card planned for
    from any machine ("h100", "h200": CUDA with Triton and fp8 assumed, this machine's devices not asked).
    fp8_weight_cache: on, off, or auto (on unless `zero` is 3: AUTO_WEIGHT_CACHE_WHY)."""
    if fused_kernels not in FUSED_MODES:
        raise ConfigError(f"--fused-kernels must be one of {', '.join(FUSED_MODES)}, got {fused_kernels!r}")
    if fp8_recipe not in FP8_RECIPES:
        raise ConfigError(f"--fp8-recipe must be one of {', '.join(FP8_RECIPES)}, got {fp8_recipe!r}")
    if fp8_weight_cache not in FP8_WEIGHT_CACHE_MODES:
        raise ConfigError(f"--fp8-weight-cache must be one of {', '.join(FP8_WEIGHT_CACHE_MODES)}, "
                          f"got {fp8_weight_cache!r}")
    cache = fp8_weight_cache == "on" or (fp8_weight_cache == "auto" and zero < 3)
    cache_why = "" if cache else AUTO_WEIGHT_CACHE_WHY if fp8_weight_cache == "auto" else "--fp8-weight-cache off"
    hopper = card in ("h100", "h200")
    cuda = hopper or device_type == "cuda"
    compiled = hopper or (cuda and has_triton())
    fused = fused_kernels == "on" or (fused_kernels == "auto" and compiled)
    elementwise = not (fused and fused_kernels == "auto" and mp > 1)  # AUTO_ELEMENTWISE_WHY
    native = hopper and fp8
    if fp8 and cuda and not hopper:
        capability = torch.cuda.get_device_capability()
        if capability < FP8_CAPABILITY:
            raise ConfigError(f"--fp8 needs a card with fp8 tensor cores (compute capability 8.9 or later); "
                              f"{torch.cuda.get_device_name()} has {capability[0]}.{capability[1]}")
        native = True
    return KernelOptions(fused=fused, elementwise=elementwise, compiled=compiled and (fused or fp8),
                         fp8=fp8_recipe if fp8 else None,
                         fp8_native=native, fp8_weight_cache=cache, fp8_cache_why=cache_why)


def region(fn, compiled: bool):
    """`fn` as a torch.compile'd region when `compiled`, else as it is. A second shape compiles it once more with
    that dimension symbolic, so the many shapes of fp8's operands stay within dynamo's recompile limit; past it
    (or at a graph break) a call runs eagerly, never fails (tests/kernels/test_compiled_regions.py holds every
    region to one graph)."""
    return torch.compile(fn) if compiled else fn
