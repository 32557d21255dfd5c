"""Forward-only evaluation through an engine's stages: the validation loss, or the logits, without touching
gradients or state.

    val = evaluate(engine, inputs, targets, micro_batches)   # every rank calls it; same float everywhere
    out = logits(engine, inputs)                             # the last stage's ranks get the full logits

Not a schedule: micro-batch by micro-batch, stage by stage in order, each stage's owner runs its modules under
no_grad and sends the output to the next stage's owner with a blocking send (the receiver knows the shape from a
probe, as the engine's executor does). Each transfer pairs one sender with one receiver and they happen in one
global order, so it cannot deadlock; it cannot overlap either, which is fine for an occasional evaluation. MP
collectives inside a stage run as in training (every MP rank of a stage runs it). The loss is the engine's (the
GPT's vocab-parallel cross-entropy over its MP group), averaged like `Engine.train_step`'s.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

import hybrid_engine._C as _C

from hybrid_engine.models import losses


@torch.no_grad()
def evaluate(engine, inputs: torch.Tensor | None, targets: torch.Tensor | None, micro_batches: int = 1) -> float:
    """Mean loss over the global evaluation batch: inputs on the first stage's ranks, targets on the last's
    (None elsewhere), this DP rank's rows (the same count on every DP rank), cut into `micro_batches` equal
    micro-batches. Collective over the world. Pass a whole evaluation slice at once: each call probes the
    stages' shapes once (one forward of zeros per stage)."""
    if engine.holds_last_stage and (targets is None or targets.shape[0] % micro_batches):
        rows = None if targets is None else targets.shape[0]
        raise ValueError(f"evaluate: targets of {rows} rows do not cut into {micro_batches} equal micro-batches")
    micro_tgt = list(targets.chunk(micro_batches)) if engine.holds_last_stage else []
    loss_fn = (losses.MSE() if losses.is_builtin(engine.loss) else
               losses.bind(engine.loss, engine.groups, engine.stages.get(engine.num_stages - 1)))
    micro_losses = [loss_fn(y, t).float() for y, t in zip(_outputs(engine, inputs, micro_batches), micro_tgt)]
    with _with_every_rank(engine):
        return engine._global_loss(micro_losses)


@contextlib.contextmanager
def _with_every_rank(engine):
    """A collective of evaluate: a peer that is not evaluating (it closed, or waits in another collective until
    the timeout) fails it with the process group's message and C++ frames, which say nothing of the cause."""
    try:
        yield
    except RuntimeError as exc:  # gloo and NCCL raise RuntimeError or its DistError kinds
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise RuntimeError(f"engine.evaluate is collective: every rank of the grid calls it, with its inputs on the "
                           f"first stage's ranks and its targets on the last's; rank {engine.groups.rank}'s peers "
                           f"did not answer ({first[:300]})") from None


@torch.no_grad()
def logits(engine, inputs: torch.Tensor | None) -> torch.Tensor | None:
    """The last stage's output for `inputs` (this DP rank's rows, on the first stage's ranks), one forward of the
    whole slice: on the last stage's ranks the full logits [rows, seq, V], their vocabulary split over MP
    gathered and its padding dropped (V: the loss's vocabulary); None on the other ranks. Collective over the
    pipeline and the MP group."""
    out = next(iter(_outputs(engine, inputs, 1)), None)
    if out is None:
        return None
    if isinstance(engine.loss, losses.LinearCrossEntropy):  # the output is the hidden states: the head's GEMM
        out = engine.loss.logits(out, engine.stages[engine.num_stages - 1])
    vocab = getattr(engine.loss, "vocab_size", None)
    if engine.grid.mp_size > 1 and vocab is not None:
        parts = [torch.empty_like(out) for _ in range(engine.grid.mp_size)]
        dist.all_gather(parts, out.contiguous(), group=engine.groups.mp)
        out = torch.cat(parts, dim=-1)
    return out[..., :vocab] if vocab is not None else out


def _outputs(engine, inputs: torch.Tensor | None, micro_batches: int) -> list[torch.Tensor]:
    """The last stage's output of each micro-batch (on its ranks; an empty list elsewhere): micro-batch by
    micro-batch, stage by stage in order."""
    pp_size, pp_rank = engine.pp_size, engine.pp_rank
    if engine.holds_first_stage and (inputs is None or inputs.shape[0] % micro_batches):
        rows = None if inputs is None else inputs.shape[0]
        raise ValueError(f"evaluate: inputs of {rows} rows do not cut into {micro_batches} equal micro-batches")
    micro_in = list(inputs.chunk(micro_batches)) if engine.holds_first_stage else []
    half = engine.precision.half_dtype if engine.precision.half_weights else None
    if half is not None:
        micro_in = [x.to(half) if x.is_floating_point() else x for x in micro_in]
    in_specs, _ = engine.stage_specs(micro_in[0] if micro_in else None)
    autocast = (torch.autocast(engine.device.type, dtype=engine.precision.half_dtype)
                if engine.precision.autocast else contextlib.nullcontext())
    owners = [_C.schedule.stage_rank(s, pp_size, engine.num_stages, engine.placement) for s in range(engine.num_stages)]
    outputs = []
    with autocast:
        for micro in range(micro_batches):
            x = micro_in[micro] if micro_in else None
            for s in range(engine.num_stages):
                owner, before = owners[s], owners[s - 1] if s > 0 else None
                if s > 0 and owner != before:
                    x = _pass(x, in_specs[s], before, owner, engine)
                if owner == pp_rank:
                    x = engine.stages[s](x)
            if engine.holds_last_stage:
                outputs.append(x)
    return outputs


def _pass(x: torch.Tensor | None, spec: torch.Tensor, src: int, dst: int, engine) -> torch.Tensor | None:
    """Stage output from pipeline rank src to dst (within this rank's pipeline); others pass None through."""
    ranks = engine.groups.pp_ranks
    if engine.pp_rank == src:
        with _with_every_rank(engine):
            dist.send(x.contiguous(), dst=ranks[dst], group=engine.groups.pp)
        return None
    if engine.pp_rank == dst:
        buffer = torch.empty(spec.shape, dtype=spec.dtype, device=engine.device)
        with _with_every_rank(engine):
            dist.recv(buffer, src=ranks[src], group=engine.groups.pp)
        return buffer
    return x
