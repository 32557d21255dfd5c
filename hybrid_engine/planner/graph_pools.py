"""What a rank's CUDA-graphed autograd stages (the GPT's and the Llama's: parallel/pipeline/graphs.py,
csrc/executor/graphed_autograd_stage.h) hold through the run beside the weights. A graph's memory pool keeps every
block it ever held and lends none to another pool, so what counts is each pool's most.

Per slot of graphs (`graphs.slots`: one per micro-batch a stage has in flight at once):
  its F pool   the micro-batch's activations and nothing more: the forward's temporaries fit in the blocks the
               activations leave. Where the slot's backward is an I, the I captures into this pool: its
               temporaries, and an embedding's weight gradient, come on top.
  beside it    the static input the replays copy into (not on the first stage) and the static output gradient (not
               on the last), in the allocator's general pool; the input gradient the backward leaves for the send
               (not on the first stage), kept in the B pool.
Per stage with B actions, the pool its slots' B graphs share: a layer's backward temporaries, and the weight
gradient an embedding's backward computes whole, in the weights' dtype, before it is added to the fp32 buffer (a
segment of its own beside the temporaries' blocks).
Per stage, the cuBLAS workspace of the stream its graphs are captured on, in the general pool.
Per transfer to or from another pipeline rank, a buffer each micro-batch, all of them through the step: a buffer
NCCL used is reused only once an event recorded on the communicator's stream at its free has passed
(ProcessGroupNCCL.pointToPoint marks every send and receive buffer as used there), and the receives posted ahead of
their use wait on that stream before such an event.

Measured on H200s with experiments/bench/graph_pools_probe.py, each pool after the captures
(results/2026-11-28-{2,4}xH200-graph-pools.json; the GPT at hidden 2560 with 4 sequences of 1024 a micro-batch, the
Llama-1B class): every F pool 0.96-1.05 of the activations the planner counts; each B pool 0.8-1.4 of a layer's
temporaries, the first stage's 0.15 GiB more on the GPT (its 32000 x 2560 bf16 table); in the general pool one
buffer of a micro-batch's hidden states per transfer of the step and per static buffer, to the buffer (the GPT's
1f1b at pp4: 20, 38, 36 and 17 on ranks 0-3); on the Llama's pipeline ranks 64-79 MiB allocated beside the weights
and their companions (two 32 MiB workspaces: the eager stream's and the capture stream's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hybrid_engine.parallel.pipeline.graphs import slots


@dataclass(frozen=True)
class GraphedStage:
    """One graphed autograd stage on a rank, in bytes of one micro-batch."""

    activations: float
    """What a micro-batch keeps from its F to its backward."""
    temporaries: float
    """A layer's backward temporaries beside them."""
    table_gradients: float
    """Weight gradients its backward computes whole in the weights' dtype (an embedding's table)."""
    first: bool
    last: bool
    receives: bool
    """Its input comes from another pipeline rank (else it is the first stage, or handed over on this rank)."""
    sends: bool
    """Its output goes to another pipeline rank."""


def graphed_bytes(program: Sequence, stages: dict[int, GraphedStage], boundary: float, micro_batches: int,
                  workspace: float) -> float:
    """What the graphed autograd stages of the rank whose compute actions (F, B, I, W in order) are `program` hold
    at once beside the weights. boundary: the bytes of one micro-batch's stage input (or output, or their
    gradients); workspace: cuBLAS's, one a capture stream."""
    total = 0.0
    for stage, g in stages.items():
        kinds = {a.type.name for a in program if a.stage == stage}
        per_slot = g.activations + boundary * (2 * (not g.first) + (not g.last))
        if "I" in kinds:
            per_slot += g.temporaries + g.table_gradients
        total += slots(program, stage) * per_slot
        if "B" in kinds:
            total += g.temporaries + g.table_gradients
        total += 2 * micro_batches * boundary * (g.receives + g.sends) + workspace
    return total
