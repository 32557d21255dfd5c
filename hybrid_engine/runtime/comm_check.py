"""Before the first step: one small all-reduce on every group this rank belongs to, timed.

Step 1 is the first time most groups carry traffic (NCCL even creates its communicators then), so a group that
cannot talk (a node whose network interface is down, a firewall between two hosts, a peer stuck in its set-up)
would otherwise show up as step 1 hanging for --comm-timeout with nothing said about where. Here each group is tried
alone, in an order every rank shares (GridGroups.named_groups), and a group that does not answer is named by its
axis, its ranks and their hosts. Groups arrive as plain values (label, group, ranks), so this module needs no
knowledge of the grid.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist


class CommCheckError(RuntimeError):
    """A group did not answer the check; the message is the whole line for the user."""


def check_groups(named: list[tuple[str, dist.ProcessGroup, list[int]]], describe: Callable[[list[int]], str],
                 device: torch.device, timeout_s: float) -> dict[str, tuple[float, list[int]]]:
    """All-reduce a one-element tensor on each group of `named` with two or more ranks, in turn; returns
    {label: (seconds, ranks)}. describe(ranks) names a group's members and hosts. CommCheckError naming the first
    group that fails (its collective timed out after `timeout_s`, the groups' own --comm-timeout, or its peers
    left) or that sums to the wrong value (members that disagree on who is in it)."""
    timings: dict[str, tuple[float, list[int]]] = {}
    for label, group, ranks in named:
        if len(ranks) < 2:
            continue
        value = torch.ones(1, device=device)
        start = time.perf_counter()
        try:
            dist.all_reduce(value, group=group)
            got = float(value.item())  # on a GPU this waits for the collective itself
        except Exception as exc:  # noqa: BLE001 - gloo and NCCL raise their own kinds on a timeout or a lost peer
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            timed_out = "timed out" in first.lower() or "timeout" in first.lower()
            why = f"did not answer within --comm-timeout {timeout_s:g} s" if timed_out else f"failed ({first[:160]})"
            raise CommCheckError(f"communication check: the {label} group of {describe(ranks)} {why}; no step "
                                 "was run") from None
        elapsed = time.perf_counter() - start
        if got != len(ranks):
            raise CommCheckError(f"communication check: the {label} group of {describe(ranks)} summed {got:g} ones, "
                                 f"not {len(ranks)}: its members disagree on who belongs to it")
        timings[label] = (elapsed, ranks)
    return timings


def axis_of(label: str) -> str:
    """'pp act channel 0->1' -> 'pp channels'; an axis label stays as it is."""
    return "pp channels" if "channel" in label else label


def summary(per_rank: list[dict[str, tuple[float, list[int]]]], describe: Callable[[list[int]], str]) -> str:
    """One line from every rank's timings: per axis, how many groups and the slowest, named."""
    slowest: dict[str, tuple[float, list[int]]] = {}
    groups: dict[str, set[tuple[int, ...]]] = {}
    for timings in per_rank:
        for label, (seconds, ranks) in timings.items():
            axis = axis_of(label)
            groups.setdefault(axis, set()).add((label, *ranks))
            if axis not in slowest or seconds > slowest[axis][0]:
                slowest[axis] = (seconds, ranks)
    if not slowest:
        return "communication check: no group of two or more ranks"
    parts = [f"{axis} {len(groups[axis])} group{'s' if len(groups[axis]) > 1 else ''}, slowest "
             f"{seconds * 1e3:.1f} ms ({describe(ranks)})" for axis, (seconds, ranks) in slowest.items()]
    return "communication check (first collective of each group, set-up included): " + "; ".join(parts)
