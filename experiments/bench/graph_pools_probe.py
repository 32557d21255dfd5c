"""Run the driver (hybrid_engine.py, any flags) and write, per rank, what the CUDA caching allocator's pools hold
once a graphed run has captured its graphs: each pool's reserved bytes, the most it had allocated at once while its
graphs were captured, and what was allocated at that moment, by the Python line that allocated it. The graphs of a
graphed stage are captured at the start of the second step (csrc/executor/graphed_autograd_stage.h): the memory
history is recorded over that step and the next, whose peaks and ends are told apart (what the capture step left
allocated that the next step frees is transient: transfers, not the slots' static buffers). A block freed while
another stream still uses it counts as held until the allocator completes its free, as the allocator holds it.

    PROBE_OUT=/tmp/pools torchrun --nproc_per_node=4 experiments/bench/graph_pools_probe.py --model gpt ... \
        --cuda-graphs on --steps 4

(experiments/passes/graph_pools_pass.sh runs the measured set.)

Out: $PROBE_OUT-rank<r>.json: {"reserved_gib", "max_reserved_gib", "max_allocated_gib", "boundary",
"max_reserved_capture_step", "pools": [{"pool", "first_use", "reserved", "allocated", "peak", "end", "next_peak",
"next_end", "at_peak": {site: bytes}, "mib_at_peak": {MiB: blocks}}]}, in the order the steps first allocated from
them (pool [0, 0]: the general one, whose blocks from before the capture step the history does not see).
PROBE_STACKS=1 instead writes $PROBE_OUT-stacks-rank<r>.json: the general pool's allocated blocks after the capture
step by allocation site, C++ frames included (TORCH_SYMBOLIZE_MODE=dladdr keeps their symbolizing quick), and its
free blocks by size.
"""
from __future__ import annotations

import bisect
import json
import os
from collections import defaultdict

import torch

import driver_in_process  # this folder: the script's own

GIB = 2**30


def site(frames: list[dict]) -> str:
    """The innermost Python line of the models, layers and kernels (not the engine's step): else the allocation came
    from C++ (autograd's backward, the graphed stage's own buffers) under the innermost Python line."""
    for f in frames:
        if "/hybrid_engine/" in f["filename"] and "/engine/engine.py" not in f["filename"]:
            return f"{f['filename'].split('/hybrid_engine/')[-1]}:{f['line']} {f['name']}"
    return f"C++ under {frames[0]['filename'].split('/')[-1]}:{frames[0]['line']}" if frames else "C++"


def pools_of(snapshot: dict, boundary: int) -> tuple[int, list[dict]]:
    """This rank's device and each pool's reserved and allocated bytes now, and, from the recorded history (the
    capture step's events before `boundary`, the next step's after), each step's peak and end of the bytes allocated
    in the pool while recording, with what was allocated at the capture step's peak (by site, and by size in MiB)."""
    by_device = defaultdict(int)
    for s in snapshot["segments"]:
        by_device[s["device"]] += s["total_size"]
    device = max(by_device, key=by_device.get)  # this rank's GPU
    segments = sorted((s for s in snapshot["segments"] if s["device"] == device), key=lambda s: s["address"])
    starts = [s["address"] for s in segments]
    reserved, allocated = defaultdict(int), defaultdict(int)
    for s in segments:
        reserved[tuple(s["segment_pool_id"])] += s["total_size"]
        allocated[tuple(s["segment_pool_id"])] += s["allocated_size"]

    def pool(addr: int):
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and addr < starts[i] + segments[i]["total_size"]:
            return tuple(segments[i]["segment_pool_id"])
        return None

    live, order = defaultdict(int), []
    peaks = [defaultdict(int), defaultdict(int)]
    ends = [defaultdict(int), defaultdict(int)]
    peak_index, at_peak, sizes_at_peak = {}, {}, {}
    blocks = defaultdict(dict)  # pool -> addr -> (size, site)
    trace = [e for e in snapshot["device_traces"][device] if e["action"] in ("alloc", "free_completed")]
    for n, e in enumerate(trace):
        step = 0 if n < boundary else 1
        if n == boundary:
            ends[0] = dict(live)
        p = pool(e["addr"])
        if p is None:
            continue
        if p not in blocks:
            order.append(p)
        if e["action"] == "alloc":
            blocks[p][e["addr"]] = (e["size"], site(e.get("frames", [])))
            live[p] += e["size"]
            if live[p] > peaks[step][p]:
                peaks[step][p] = live[p]
                if step == 0:
                    peak_index[p] = n
        elif e["addr"] in blocks[p]:
            live[p] -= blocks[p].pop(e["addr"])[0]
    ends[1] = dict(live)
    if boundary >= len(trace):
        ends[0] = dict(live)
    # what was allocated at each pool's capture-step peak: replay up to it
    wanted = {n: p for p, n in peak_index.items()}
    held = defaultdict(dict)
    for n, e in enumerate(trace[:max(wanted, default=-1) + 1]):
        p = pool(e["addr"])
        if p is None:
            continue
        if e["action"] == "alloc":
            held[p][e["addr"]] = (e["size"], site(e.get("frames", [])))
        else:
            held[p].pop(e["addr"], None)
        if n in wanted and wanted[n] == p:
            by_site, by_size = defaultdict(int), defaultdict(int)
            for size, where in held[p].values():
                by_site[where] += size
                by_size[round(size / 2**20, 1)] += 1
            at_peak[p] = dict(sorted(by_site.items(), key=lambda kv: -kv[1])[:16])
            sizes_at_peak[p] = dict(sorted(by_size.items(), key=lambda kv: -kv[0] * kv[1])[:16])
    order += [p for p in reserved if p not in order]
    return device, [{"pool": list(p), "first_use": n, "reserved": reserved[p], "allocated": allocated[p],
                     "peak": peaks[0].get(p, 0), "end": ends[0].get(p, 0), "next_peak": peaks[1].get(p, 0),
                     "next_end": ends[1].get(p, 0), "at_peak": at_peak.get(p, {}),
                     "mib_at_peak": sizes_at_peak.get(p, {})} for n, p in enumerate(order)]


ALLOCATOR_FRAMES = ("CachingAllocator", "c10::cuda", "at::detail::empty", "empty_cuda", "empty_generic",
                    "at::empty", "at::_ops::empty", "wrapper_CUDA", "c10::impl::", "at::native::empty",
                    "c10::Dispatcher", "c10::BoxedKernel", "torch::jit", "_PyEval", "PyObject", "_Py", "python3")


def held_by_site(snapshot: dict, device: int) -> dict:
    """The general pool's allocated blocks now, by where they were allocated (the innermost Python line and the
    first C++ frames past the allocator's own), largest first; and its free blocks, by size in MiB."""
    by_site, free = defaultdict(lambda: [0, 0]), defaultdict(int)
    for seg in snapshot["segments"]:
        if seg["device"] != device or tuple(seg["segment_pool_id"]) != (0, 0):
            continue
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                free[round(b["size"] / 2**20)] += b["size"]
                continue
            frames = b.get("frames", [])
            python = [f for f in frames if f["filename"].endswith(".py")]
            native = [f["name"][:90] for f in frames if not f["filename"].endswith(".py")
                      and not any(a in f["name"] for a in ALLOCATOR_FRAMES)]
            where = (site(python) if python else "-") + " | " + " < ".join(native[:4])
            by_site[where][0] += b["size"]
            by_site[where][1] += 1
    return {"allocated": {k: v for k, v in sorted(by_site.items(), key=lambda kv: -kv[1][0])[:40]},
            "free_mib": {k: v for k, v in sorted(free.items(), key=lambda kv: -kv[1])[:20]}}


def stacks_main(out: str, rank: str) -> None:
    """PROBE_STACKS=1: C++ frames too, recorded from the start, and only the general pool's blocks after the
    capture step, by site (what lives there beyond the weights and their companions)."""
    from hybrid_engine.engine.engine import Engine
    torch.cuda.memory._record_memory_history(max_entries=1000, context="alloc", stacks="all")
    train_step, calls = Engine.train_step, [0]

    def stepped(self, *args, **kw):
        step = calls[0]
        calls[0] += 1
        result = train_step(self, *args, **kw)
        if step == 1:
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
            device = torch.cuda.current_device()
            by_device = defaultdict(int)
            for seg in snapshot["segments"]:
                by_device[seg["device"]] += seg["total_size"]
            device = max(by_device, key=by_device.get)
            with open(f"{out}-stacks-rank{rank}.json", "w") as f:
                json.dump(held_by_site(snapshot, device), f, indent=1)
        return result

    Engine.train_step = stepped


def pools_main(out: str, rank: str) -> None:
    """Every pool's reserved and allocated bytes over the capture step and the next (the module's docstring)."""
    from hybrid_engine.engine.engine import Engine
    train_step, calls, marks = Engine.train_step, [0], {}

    def stepped(self, *args, **kw):
        step, cuda = calls[0], torch.cuda.is_available()
        calls[0] += 1
        if cuda and step == 1:
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, context="alloc", stacks="python")
        result = train_step(self, *args, **kw)
        if cuda and step in (1, 2):
            torch.cuda.synchronize()
            device = torch.cuda.current_device()
            if step == 1:  # where the capture step's events end in the history
                first = torch.cuda.memory._snapshot()
                mine = max(range(len(first["device_traces"])), key=lambda d: len(first["device_traces"][d]))
                marks.update(boundary=sum(e["action"] in ("alloc", "free_completed")
                                          for e in first["device_traces"][mine]),
                             max_reserved_capture_step=torch.cuda.max_memory_reserved(mine) / GIB)
                return result
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            device, pools = pools_of(snapshot, marks["boundary"])
            summary = {"device": device, "reserved_gib": torch.cuda.memory_reserved(device) / GIB,
                       "max_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
                       "max_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB, **marks,
                       "pools": pools}
            with open(f"{out}-rank{rank}.json", "w") as f:
                json.dump(summary, f, indent=1)
        return result

    Engine.train_step = stepped


def main() -> None:
    out, rank = os.environ["PROBE_OUT"], os.environ.get("RANK", "0")
    driver_in_process.enter()
    stacks = os.environ.get("PROBE_STACKS") == "1" and torch.cuda.is_available()
    (stacks_main if stacks else pools_main)(out, rank)
    driver_in_process.run()


if __name__ == "__main__":
    main()
