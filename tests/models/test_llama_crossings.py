"""A Llama step stays native: the Python <-> C++ crossings of a training step (tests/crossings.py) are a small
constant, whatever the depth, on one rank and on an mp 2 grid (gloo), where the layers run their tensor-parallel
operators. The layers reach C++ through torch's dispatcher (torch.ops.hybrid), the gradients of the parameters
autograd accumulates reach the grad buffer through C++ hooks, so what is left is the executor's call and the
Python it calls back per micro-batch: the stage's forward, the loss and the loss's backward."""
from __future__ import annotations

import pytest

from crossings import Crossings
from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.workload import llama_workload
from hybrid_engine.parallel.grid import build_groups

VOCAB, SEQ = 67, 16
MOST = 10  # crossings of a one-micro-batch step
PER_MICRO = 3  # callbacks per further micro-batch: the stage's forward, the loss, the loss's backward


def _step_crossings(rank: int, world: int, layers: int, micro: int, sequence_parallel: bool) -> Crossings:
    cfg = LlamaConfig(VOCAB, layers, 32, 4, 2, 48, SEQ, rope_theta=500.0, seed=3)
    data = TokenDataset(MarkovChain(5, vocab=VOCAB).sample(4096, 7), VOCAB, SEQ, seed=11)
    workload = llama_workload(cfg, data, sequence_parallel=sequence_parallel, vocab_from_data=False)
    groups = build_groups(ProcessGrid(1, 1, world), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=micro, **workload.engine_kwargs(1))
    try:
        for step in range(2):  # the first step builds the executor
            x, y = workload.draw(step, 0, 2 * micro)
            with Crossings() as crossings:
                engine.train_step(x, y)
        return crossings
    finally:
        engine.close()
        groups.destroy()


def _sweep(rank: int, world: int, sequence_parallel: bool) -> dict:
    """(layers, micro-batches) -> the step's crossings, counted on this rank."""
    return {(layers, micro): _step_crossings(rank, world, layers, micro, sequence_parallel)
            for layers in (2, 4) for micro in (1, 2)}


def _check(counts: dict) -> None:
    report = "\n".join(f"{key}: {c}" for key, c in counts.items())
    assert counts[(2, 1)].total <= MOST, report
    assert counts[(2, 1)].total == counts[(4, 1)].total, report
    assert counts[(2, 2)].total == counts[(4, 2)].total, report
    assert counts[(2, 2)].total - counts[(2, 1)].total <= PER_MICRO, report


def test_one_rank_step_crossings_are_a_constant():
    _check(run_ranks(1, _sweep, False)[0])


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_mp2_step_crossings_are_a_constant(sequence_parallel):
    for report in run_ranks(2, _sweep, sequence_parallel, timeout=120):
        _check(report)
