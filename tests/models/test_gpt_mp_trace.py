"""The GPT's MP collectives under --trace (csrc/tp/parallel_linear.h): each tensor-parallel linear records its
collective on the engine's CommTrace, labelled with its block, so a traced step draws them beside the compute."""
from __future__ import annotations

from collections import Counter

import pytest
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.workload import gpt_workload

LAYERS, MICRO = 2, 2


def traced_step(rank: int, world: int, sequence_parallel: bool) -> list[Counter]:
    cfg = GPTConfig(vocab_size=64, layers=LAYERS, hidden=32, heads=4, seq_len=8, seed=3)
    data = TokenDataset(MarkovChain(5, vocab=64).sample(2048, 7), 64, 8, seed=11)
    workload = gpt_workload(cfg, data, sequence_parallel=sequence_parallel)
    groups = build_groups(ProcessGrid(1, 1, 2), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=MICRO, trace=True,
                         **workload.engine_kwargs(1))
    steps = []
    for step in range(2):
        x, y = workload.draw(step, 0, 4)
        engine.train_step(x, y)
        steps.append(Counter((c.kind, c.bucket) for c in engine.comm_trace if c.axis == "mp"))
    engine.close()
    groups.destroy()
    dist.barrier()
    return steps


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_every_block_records_its_mp_collectives_each_micro_batch(sequence_parallel):
    for steps in run_ranks(2, traced_step, sequence_parallel, timeout=180):
        mp = steps[-1]  # the second step: the first also holds the shape probe's forward
        for block in range(1, LAYERS + 1):
            if sequence_parallel:  # qkv and fc1 gather forward and reduce-scatter their input gradient; proj and
                # fc2 reduce-scatter forward and gather their output gradient (gloo: all-reduce for reduce-scatter)
                assert mp[("all_gather", block)] == 4 * MICRO and mp[("all_reduce", block)] == 4 * MICRO, mp
            else:  # proj and fc2 all-reduce forward, qkv and fc1 all-reduce their input gradient backward
                assert mp[("all_reduce", block)] == 4 * MICRO, mp
