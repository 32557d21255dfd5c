"""torch.compile traces a tensor-parallel Llama block whole: its layers are torch operators (torch.ops.hybrid.*)
whose C++ autograd AOTAutograd traces through, their collectives c10d's functional ones while torch traces
(csrc/comm/collectives.h), so `fullgraph=True` holds (a graph break would raise) and the compiled block (inductor,
CPU) gives the eager block's output and gradients (fp32, 1e-5), on one rank and on mp 2 (gloo), with and without
sequence parallelism."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.model import build_llama
from hybrid_engine.models.llama.parallelize import parallelize_llama

TOL = dict(rtol=1e-5, atol=1e-6)


def _forward_backward(block, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.detach().requires_grad_()
    out = block(x)
    out.square().sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    return out.detach(), grads


def _compiled_block_matches_eager(rank: int, world: int, sequence_parallel: bool) -> None:
    torch.manual_seed(0)
    group = dist.new_group(list(range(world))) if world > 1 else None
    cfg = LlamaConfig(67, 1, 32, 4, 2, 48, 16, rope_theta=500.0, seed=3)
    dense = build_llama(cfg)
    block = parallelize_llama(torch.nn.Sequential(dense[1]), group, sequence_parallel)[0]
    seq = 16 // world if sequence_parallel else 16
    x = torch.randn(2, seq, 32, generator=torch.Generator().manual_seed(rank if sequence_parallel else 0))
    eager_out, eager_grads = _forward_backward(block, x)
    torch._dynamo.reset()
    compiled_out, compiled_grads = _forward_backward(torch.compile(block, fullgraph=True), x)
    torch.testing.assert_close(compiled_out, eager_out, **TOL)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("world,sequence_parallel", [(1, False), (2, False), (2, True)])
def test_compiled_tensor_parallel_block_matches_eager(world, sequence_parallel):
    run_ranks(world, _compiled_block_matches_eager, sequence_parallel, timeout=600)
