"""The fused kernels' compiled regions (the path CUDA with Triton takes), compiled here by Inductor for the CPU, with
fp8's GEMMs beside them (their quantization eager here: its Triton kernels are a GPU's): each region compiles as
one graph (fullgraph: no break) within dynamo's recompile limit across every shape and dtype a Llama's layers give
it (a run would fall back to eager, not fail: here either fails the test), and the compiled Llama trains what the
eager one trains."""
from __future__ import annotations

import functools

import pytest
import torch

from hybrid_engine.kernels.options import KernelOptions

from kernel_models import train_one_process

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow  # Inductor compiles about a dozen regions: about 20 s
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_the_compiled_regions_train_what_the_eager_code_trains(recipe, monkeypatch):
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, fullgraph=True))
    compiled = train_one_process(KernelOptions(fused=True, compiled=True, fp8=recipe), 3, tied=True)
    eager = train_one_process(KernelOptions(fused=True, compiled=False, fp8=recipe), 3, tied=True)
    for a, b in zip(compiled, eager):
        assert abs(a - b) <= 1e-5 * abs(b), (compiled, eager)
