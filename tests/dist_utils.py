"""Run a function on N gloo ranks in fresh processes, with no hangs.

    results = run_ranks(4, my_fn, arg1, arg2, timeout=60)   # my_fn(rank, world_size, arg1, arg2) on each rank

`my_fn` must be a module-level function (children import it by name); whatever it returns must pickle and
comes back as results[rank]. Children are forked from a forkserver that has torch imported, so a launch
costs about a second, not an import of torch per rank. The default process group is set up before `my_fn`
runs and torn down after. If any rank raises or dies, or the timeout passes, every child is killed and the test fails
with the failing rank's traceback. The rendezvous is a TCPStore served by the parent on a port the OS picks, so parallel
test runs never race for a TCP port.
"""
from __future__ import annotations

import datetime
import os
import queue
import sys
import time
import traceback
from typing import Any, Callable

import pytest
import torch.multiprocessing as mp

_GRACE_S = 2.0  # how long a dead child's last message may take to arrive through the pipe


def _child(rank: int, world_size: int, store_port: int, fn: Callable, args: tuple, results: Any, timeout: float):
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share a few cores
        dist.init_process_group(
            "gloo",
            store=dist.TCPStore("127.0.0.1", store_port, world_size, is_master=False,
                                timeout=datetime.timedelta(seconds=timeout)),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),  # a collective missing a peer errors out, never hangs
        )
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        message = (rank, True, value)
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        message = (rank, False, traceback.format_exc())
    results.put(message)
    # Skip interpreter teardown (seconds with torch loaded, times N ranks on a few cores) once the
    # message is through the pipe.
    results.close()
    results.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _context():
    """forkserver with torch preloaded: the server imports torch once per test session, every child after
    that is a fork of it (no torch import per rank, no fork of a parent whose thread pools are running).
    torch._dynamo too: every torch.optim optimizer imports it (and sympy) when first built, about 1.5 s of CPU
    in each rank that builds an engine, against 0.1 s for the rest of a small test's work. hybrid_engine and pytest
    too (the test modules whose functions the ranks run import both): about 0.15 s of CPU in every rank, which the
    suite starts some 570 of."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "pytest", "hybrid_engine"])
    return ctx


def _stop(procs: list, grace: float) -> None:
    """Let children exit on their own for `grace` seconds, then terminate, then kill."""
    end = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=2)
        if p.is_alive():
            p.kill()
            p.join(timeout=2)


def run_ranks(world_size: int, fn: Callable, *args: Any, timeout: float = 60) -> list:
    """fn(rank, world_size, *args) on `world_size` gloo ranks; returns the per-rank results, in rank order."""
    ctx = _context()
    results = ctx.Queue()
    outcome: dict[int, tuple[bool, Any]] = {}
    procs: list = []
    finished = False
    # The parent serves the rendezvous store on a port the OS picks, so parallel runs never race for a port.
    # (A FileStore would do too, but it rescans its whole file on every lookup: a test that creates
    # hundreds of groups slows to a crawl.)
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    try:
        for rank in range(world_size):
            p = ctx.Process(
                target=_child, args=(rank, world_size, store.port, fn, args, results, timeout), daemon=True
            )
            p.start()
            procs.append(p)

        deadline = time.monotonic() + timeout
        dead_since: dict[int, float] = {}
        while len(outcome) < world_size:
            now = time.monotonic()
            if now > deadline:
                missing = sorted(set(range(world_size)) - set(outcome))
                pytest.fail(f"run_ranks: ranks {missing} still running after {timeout} s (killed)")
            try:
                rank, ok, value = results.get(timeout=0.1)
                outcome[rank] = (ok, value)
                if not ok:
                    # a peer that died without a word is the cause, and the failing rank only saw it go (gloo's
                    # "connection closed by peer"): the death is what the test is told
                    dead = [(r, p.exitcode) for r, p in enumerate(procs)
                            if r not in outcome and p.exitcode not in (None, 0)]
                    if dead:
                        pytest.fail(f"run_ranks: rank {dead[0][0]} of {world_size} died with exit code {dead[0][1]}")
                    pytest.fail(f"run_ranks: rank {rank} of {world_size} failed:\n{value}", pytrace=False)
                continue
            except queue.Empty:
                pass
            for rank, p in enumerate(procs):  # died without a word (segfault, os._exit, OOM kill)
                if rank in outcome or p.is_alive():
                    continue
                first_seen = dead_since.setdefault(rank, now)
                if now - first_seen > _GRACE_S:
                    pytest.fail(f"run_ranks: rank {rank} of {world_size} died with exit code {p.exitcode}")
        finished = True
    finally:
        _stop(procs, grace=5.0 if finished else 0.0)
        results.close()
    return [outcome[rank][1] for rank in range(world_size)]
