"""The context-parallel group as the ring and the gather see it: this rank's place in it, the P2P hop to a
neighbour and the all-gather / reduce-scatter of K/V, each transfer recorded in the run's trace (--trace: the
engine's CommTrace, axis cp, beside the DP and MP collectives) when it keeps one.

A hop is one isend and one irecv (batch_isend_irecv: NCCL runs them on its own stream, gloo on its threads), so
the caller computes while the next block travels and waits only when it needs it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import time

import torch
import torch.distributed as dist

__all__ = ["RingComm", "Pending"]


@dataclass
class Pending:
    """A transfer in flight; wait() returns what arrived."""

    works: list
    received: torch.Tensor
    on_done: object = None  # called once the transfer is complete (a host transfer's trace record)

    def wait(self) -> torch.Tensor:
        for work in self.works:
            work.wait()
        if self.on_done is not None:
            self.on_done()
            self.on_done = None
        return self.received


@dataclass
class RingComm:
    """rank and size within the cp group; ranks: the group's global ranks by cp coordinate (what P2P names);
    trace: the engine's _C.CommTrace (None: not traced)."""

    group: dist.ProcessGroup
    rank: int
    size: int
    ranks: list[int]
    trace: object = field(default=None, repr=False)

    def source(self, step: int, direction: int) -> int:
        """Whose block this rank holds after `step` hops in `direction` (+1: blocks move to the next rank)."""
        return (self.rank - direction * step) % self.size

    def _traced(self, kind: str, hop: int, work) -> None:
        if self.trace is not None and work is not None:
            self.trace.launched(kind, hop, work)

    def shift(self, tensor: torch.Tensor, direction: int, tag: int, hop: int = 0) -> Pending:
        """Send `tensor` to the neighbour `direction` (+1 next, -1 previous) and receive the other neighbour's."""
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        to = self.ranks[(self.rank + direction) % self.size]
        frm = self.ranks[(self.rank - direction) % self.size]
        ops = [dist.P2POp(dist.isend, tensor, to, self.group, tag),
               dist.P2POp(dist.irecv, received, frm, self.group, tag)]
        launch_ns = time.monotonic_ns()
        works = dist.batch_isend_irecv(ops)
        if tensor.device.type != "cpu":
            self._traced("send_recv", hop, works[-1] if works else None)  # the receive (NCCL: the pair) ends last
            return Pending(works, received)
        # gloo's P2P works have no future to time them by: the hop ends when this rank's wait sees it done
        trace = self.trace
        done = (None if trace is None else
                lambda: trace.completed_on_host("send_recv", hop, launch_ns, time.monotonic_ns()))
        return Pending(works, received, done)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[size, *tensor.shape]: every rank's tensor, by cp coordinate."""
        tensor = tensor.contiguous()
        out = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype, device=tensor.device)
        work = dist.all_gather(list(out.unbind(0)), tensor, group=self.group, async_op=True)
        self._traced("all_gather", 0, work)
        work.wait()
        return out

    def reduce_scatter(self, stacked: torch.Tensor) -> torch.Tensor:
        """stacked [size, ...]: the sum over ranks of stacked[self.rank]. gloo has no reduce-scatter: there it is
        an all-reduce of the whole, then this rank's part."""
        stacked = stacked.contiguous()
        if dist.get_backend(self.group) == "gloo":
            work = dist.all_reduce(stacked, group=self.group, async_op=True)
            self._traced("all_reduce", 0, work)
            work.wait()
            return stacked[self.rank]
        out = torch.empty(stacked.shape[1:], dtype=stacked.dtype, device=stacked.device)
        work = dist.reduce_scatter_tensor(out, stacked, group=self.group, async_op=True)
        self._traced("reduce_scatter", 0, work)
        work.wait()
        return out
