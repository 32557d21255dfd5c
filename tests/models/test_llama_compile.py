"""torch.compile traces a tensor-parallel Llama block whole: its layers are torch operators (torch.ops.hybrid.*)
whose C++ autograd AOTAutograd traces through, their collectives c10d's functional ones while torch traces
(csrc/comm/collectives.h), so `fullgraph=True` holds (a graph break would raise) and the compiled block (inductor,
CPU) gives the eager block's output and gradients (fp32, 1e-5), on one rank and on mp 2 (gloo), with and without
sequence parallelism. The engine's --compile (its stages under torch.compile, the grad buffer attached) trains the
mp 2 Llama without a graph break, to the eager engine's losses: inside the compiled graph the weight gradients go
back to autograd, and the buffer's gradient hooks route them."""
from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo.utils
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.model import dense_llama
from hybrid_engine.models.llama.parallelize import parallelize_llama
from hybrid_engine.models.llama.workload import llama_workload
from hybrid_engine.parallel.grid import build_groups

TOL = dict(rtol=1e-5, atol=1e-6)


def _forward_backward(block, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.detach().requires_grad_()
    out = block(x)
    out.square().sum().backward()
    grads = [x.grad] + [p.grad.clone() for p in block.parameters()]
    block.zero_grad(set_to_none=True)
    return out.detach(), grads


def _compiled_block_matches_eager(rank: int, world: int, sequence_parallel: bool, cache: str) -> None:
    """Under sequence parallelism compiled twice in one fresh inductor cache that the ranks share (as a machine's
    processes do): the second compile loads what the first stored, so a graph cached under a key that does not tell
    the ranks apart would run on the wrong rank (its slices are rank-specific there); otherwise compiled once, in
    the machine's cache (kernels other tests compiled load from it instead of being built again). The fresh cache's
    graphs are its own, its C++ kernels the machine's (_fresh_graph_cache)."""
    if sequence_parallel:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch.manual_seed(0)
    group = dist.new_group(list(range(world))) if world > 1 else None
    cfg = LlamaConfig(67, 1, 32, 4, 2, 48, 16, rope_theta=500.0, seed=3)
    dense = dense_llama(cfg)
    block = parallelize_llama(torch.nn.Sequential(dense[1]), group, sequence_parallel)[0]
    seq = 16 // world if sequence_parallel else 16
    x = torch.randn(2, seq, 32, generator=torch.Generator().manual_seed(rank if sequence_parallel else 0))
    eager_out, eager_grads = _forward_backward(block, x)
    for _ in range(2 if sequence_parallel else 1):
        torch._dynamo.reset()
        compiled_out, compiled_grads = _forward_backward(torch.compile(block, fullgraph=True), x)
        torch.testing.assert_close(compiled_out, eager_out, **TOL)
        for got, want in zip(compiled_grads, eager_grads):
            torch.testing.assert_close(got, want, **TOL)


def _fresh_graph_cache(root) -> str:
    """An inductor cache with no graphs in it (fxgraph/ and aotautograd/ start empty) whose kernel folders and their
    build locks are the machine cache's: a kernel is stored by the hash of its source, so loading a built one is what
    g++ would make of that source, while every graph of the two compiles is looked up and stored by its key here.
    Building the block's ~20 kernels again costs ~40 s of g++ on one core, and they are the same on every run."""
    machine = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if machine is None:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        machine = default_cache_dir()
    cache = os.path.join(root, "inductor")
    os.makedirs(cache)
    # a kernel's folder is the first two characters of its hash (base32): every one of them links to the machine's,
    # so the kernels a cold machine builds here are there for the next run too
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    for name in (a + b for a in alphabet for b in alphabet):
        os.makedirs(os.path.join(machine, name), exist_ok=True)
        os.symlink(os.path.join(machine, name), os.path.join(cache, name))
    os.makedirs(os.path.join(machine, "locks"), exist_ok=True)  # one build of a kernel at a time, as elsewhere
    os.symlink(os.path.join(machine, "locks"), os.path.join(cache, "locks"))
    return cache


@pytest.mark.parametrize("world,sequence_parallel", [(1, False), (2, False), (2, True)])
def test_compiled_tensor_parallel_block_matches_eager(world, sequence_parallel, tmp_path):
    cache = _fresh_graph_cache(tmp_path) if sequence_parallel else ""
    run_ranks(world, _compiled_block_matches_eager, sequence_parallel, cache, timeout=600)


def _engine_losses(rank: int, world: int, compile: bool) -> tuple[list[float], int]:
    """Three steps of 2 micro-batches; and the graph breaks torch.compile counted."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    cfg = LlamaConfig(67, 2, 32, 4, 2, 48, 16, rope_theta=500.0, seed=3)
    data = TokenDataset(MarkovChain(5, vocab=67).sample(4096, 7), 67, 16, seed=11)
    workload = llama_workload(cfg, data, vocab_from_data=False)
    groups = build_groups(ProcessGrid(1, 1, world), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=2, optimizer="sgd", lr=0.1,
                         stage_compile=compile, **workload.engine_kwargs(1))
    losses = [engine.train_step(*workload.draw(step, 0, 4)).loss for step in range(3)]
    engine.close()
    groups.destroy()
    return losses, sum(torch._dynamo.utils.counters["graph_break"].values())


def test_engine_compile_trains_the_eager_curve_without_a_graph_break():
    eager, _ = run_ranks(2, _engine_losses, False, timeout=600)[0]
    compiled, breaks = run_ranks(2, _engine_losses, True, timeout=600)[0]
    assert breaks == 0
    torch.testing.assert_close(compiled, eager, **TOL)
