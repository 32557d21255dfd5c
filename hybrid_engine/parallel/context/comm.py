"""The context-parallel group as the ring and the gather see it: this rank's place in it, the P2P hop to a
neighbour and the all-gather / reduce-scatter of K/V, each transfer recorded in the run's trace when it keeps one.

A hop is one isend and one irecv (batch_isend_irecv: NCCL runs them on its own stream, gloo on its threads), so
the caller computes while the next block travels and waits only when it needs it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["RingComm", "Pending", "TraceSpan"]


@dataclass
class TraceSpan:
    """One transfer of the ring or the gather: what (kind), bytes, and its launch and completion (perf_counter
    seconds; CUDA transfers end when the host saw them complete)."""

    kind: str
    nbytes: int
    start_s: float
    end_s: float = 0.0


@dataclass
class Pending:
    """A transfer in flight; wait() returns what arrived."""

    works: list
    received: torch.Tensor
    span: TraceSpan | None = None

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        if self.span is not None:
            self.span.end_s = time.perf_counter()
        return self.received


@dataclass
class RingComm:
    """rank and size within the cp group; ranks: the group's global ranks by cp coordinate (what P2P names);
    spans: the transfers recorded (None: not traced)."""

    group: dist.ProcessGroup
    rank: int
    size: int
    ranks: list[int]
    spans: list[TraceSpan] | None = field(default=None, repr=False)

    def source(self, step: int, direction: int) -> int:
        """Whose block this rank holds after `step` hops in `direction` (+1: blocks move to the next rank)."""
        return (self.rank - direction * step) % self.size

    def _span(self, kind: str, tensor: torch.Tensor) -> TraceSpan | None:
        if self.spans is None:
            return None
        span = TraceSpan(kind, tensor.numel() * tensor.element_size(), time.perf_counter())
        self.spans.append(span)
        return span

    def shift(self, tensor: torch.Tensor, direction: int, tag: int) -> Pending:
        """Send `tensor` to the neighbour `direction` (+1 next, -1 previous) and receive the other neighbour's."""
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        to = self.ranks[(self.rank + direction) % self.size]
        frm = self.ranks[(self.rank - direction) % self.size]
        span = self._span(f"cp ring {'kv' if tag == 1 else 'dkv'} {'+1' if direction > 0 else '-1'}", tensor)
        ops = [dist.P2POp(dist.isend, tensor, to, self.group, tag),
               dist.P2POp(dist.irecv, received, frm, self.group, tag)]
        return Pending(dist.batch_isend_irecv(ops), received, span)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[size, *tensor.shape]: every rank's tensor, by cp coordinate."""
        tensor = tensor.contiguous()
        span = self._span("cp all-gather kv", tensor)
        out = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        dist.all_gather(list(out.unbind(0)), tensor, group=self.group)
        if span is not None:
            span.end_s = time.perf_counter()
        return out

    def reduce_scatter(self, stacked: torch.Tensor) -> torch.Tensor:
        """stacked [size, ...]: the sum over ranks of stacked[self.rank]. gloo has no reduce-scatter: there it is
        an all-reduce of the whole, then this rank's part."""
        stacked = stacked.contiguous()
        span = self._span("cp reduce-scatter dkv", stacked)
        if dist.get_backend(self.group) == "gloo":
            dist.all_reduce(stacked, group=self.group)
            out = stacked[self.rank]
        else:
            out = torch.empty(stacked.shape[1:], dtype=stacked.dtype, device=stacked.device)
            dist.reduce_scatter_tensor(out, stacked, group=self.group)
        if span is not None:
            span.end_s = time.perf_counter()
        return out
