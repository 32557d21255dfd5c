#!/usr/bin/env python3
"""Peak memory per batch row, per pipeline rank, on the CPU: where the bytes of max_batch.py's slope go.

    python experiments/bench/memory_per_row.py [--dim 256 --depth 16 --micro-batches 8 --batches 2048,8192]
                                         [--modes fp32,bf16,bf16-recompute] [--json out.json]

Two gloo ranks (pp = 2, 1F1B by default) run the driver's loop (hybrid_engine.py: the engine, data drawn per
rank with SyntheticRegression.draw in the engine's dtype, dropped after each step) for --steps steps at each
batch, under torch.profiler(profile_memory=True). The CPU allocator reports every allocation and free with the
running total ("Total Allocated", counted from the profiler's start, so everything the run allocates is in
it: weights, masters, gradients, data, activations). That total plays the part of max_memory_allocated on the
GPU: per rank, the peak at two batches gives the slope in bytes per global row, printed in units of D bytes
(D = --dim; per-row bytes scale with D, so "x D" is comparable with experiments/README.md's model) and as
KB/row at D = 4096.

At the larger batch's peak the allocations still alive are listed, grouped by who made them (the autograd
node or aten op they were allocated under, inside the labelled phases: data, train_step) and by
their size in bytes per element of one micro-batch (2 = a half activation, 4 = an fp32 copy; whole-batch data
shows as 2 x m or 4 x m), in D per row of that batch; allocations of sizes that do not scale with the batch are fixed
memory (weights, fp32 masters, gradient buckets) and are summed apart.

CPU-only terms (absent on CUDA + NCCL) to discount when reading the lists:
* csrc/tp/main_grad.cpp's addmm_into (half weights) casts the layer's gradient and input to fp32 before the
  weight-gradient GEMM on the CPU (on CUDA one GEMM reads them in half): `LinearChain.backward / aten::_to_copy`.
* gloo's send work reports isCompleted() only once waited for, so the executor's reap_sends(false) never frees
  a gloo send payload before the end of the step: the stage outputs (rank 0) and input
  gradients (rank 1, `LinearChain.backward / aten::mm`) of finished micro-batches stay listed. NCCL's work
  completes with its CUDA event, so on the GPU a payload lives until the peer has received it.

--loss python runs F.mse_loss(out.float(), target.float()) through Python (losses.as_micro_loss), which is what
the C++ "mse" loss computed before it stopped keeping fp32 copies and a micro-batch-sized loss storage per
micro-batch (csrc/bind_executor.cpp): the "before" of that change.

bf16 stands for fp16: on the CPU fp16 matrix products do not run, bf16 takes the same half-weights path
(Precision(amp, "half-weights")).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

MODES = {  # name: (amp, recompute)
    "fp32": ("off", False),
    "bf16": ("bf16", False),
    "bf16-recompute": ("bf16", True),
    "fp32-recompute": ("off", True),
}

# Phases labelled with record_function around the Python parts of the step (the executor's C++ runs between).
PHASES = ("data", "train_step")
GENERIC = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::to", "aten::clone", "aten::copy_",
           "aten::resize_", "aten::zeros", "aten::zeros_like", "aten::new_empty_strided", "aten::contiguous"}


def _short(name: str) -> str:
    if "LinearChainFunction" in name:
        return "LinearChain.backward"
    if "CppNode<" in name and name.endswith("::Mse>"):
        return "CppMse.backward"  # the executor's C++ "mse" loss (csrc/bind_executor.cpp)
    return name.replace("autograd::engine::evaluate_function: ", "").replace("torch::autograd::", "")


def analyse(trace_path: str, tid: int | None = None) -> dict:
    """Peak of the allocator's running total, and what is alive at that moment (grouped by who allocated it)."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    mem = [e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    mem.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
    ops.sort(key=lambda e: (e["ts"], -e["dur"]))

    def stack_at(e) -> list[str]:
        t = e["ts"]
        return [o["name"] for o in ops if o["tid"] == e["tid"] and o["ts"] <= t <= o["ts"] + o["dur"]
                and not o["name"].startswith("gloo:")]  # a gloo send's span lasts until it is waited for

    live: dict[int, tuple[int, dict]] = {}
    peak, peak_live, peak_event = -1, {}, None
    for e in mem:
        a = e["args"]
        if a["Bytes"] > 0:
            live[a["Addr"]] = (a["Bytes"], e)
        else:
            live.pop(a["Addr"], None)
        if a["Total Allocated"] > peak:
            peak, peak_live, peak_event = a["Total Allocated"], dict(live), e

    def label(e) -> str:
        stack = stack_at(e)
        phases = [s for s in stack if s in PHASES]
        nodes = [_short(s) for s in stack if "evaluate_function" in s or "Backward" in s or "CppNode" in s]
        leaf = [s for s in stack if s.startswith("aten::") and s not in GENERIC]
        where = phases[-1] if phases else "-"
        if nodes:
            where += " / " + nodes[-1]
        return where + " / " + (leaf[-1] if leaf else (stack[-1] if stack else "?"))

    groups: dict[str, dict] = {}
    for nbytes, e in peak_live.values():
        g = groups.setdefault(label(e), {"bytes": 0, "sizes": defaultdict(int)})
        g["bytes"] += nbytes
        g["sizes"][nbytes] += 1
    return {"peak_bytes": peak, "at_peak": " > ".join(_short(s) for s in stack_at(peak_event)) if peak_event else "",
            "live": {k: {"bytes": v["bytes"], "sizes": dict(v["sizes"])} for k, v in groups.items()}}


def rank_main(rank: int, world: int, store_path: str, cfg: dict, out_dir: str, results) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function

    from hybrid_engine import ProcessGrid
    from hybrid_engine.models import losses
    from hybrid_engine.engine.engine import Engine
    from hybrid_engine.config.engine import PrecisionConfig, ScheduleConfig, StageConfig
    from hybrid_engine.parallel.grid import build_groups
    from hybrid_engine.models import SyntheticRegression, large_linear_model

    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    out = {}
    try:
        for mode in cfg["modes"]:
            amp, recompute = MODES[mode]
            for batch in cfg["batches"]:
                dist.barrier()
                path = os.path.join(out_dir, f"{mode}-{batch}-rank{rank}.json")
                with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                    groups = build_groups(ProcessGrid(1, world, 1), rank)
                    # "python": a callable loss is run as loss_fn(out.float(), target.float())
                    # (losses.as_micro_loss): what the C++ MSE computed before it kept no fp32 copies
                    loss_fn = losses.MSE() if cfg["loss"] == "mse" else (lambda o, t: F.mse_loss(o, t))
                    engine = Engine(large_linear_model(cfg["dim"], cfg["depth"], 0), loss_fn, groups,
                                    schedule=ScheduleConfig(cfg["schedule"], cfg["micro_batches"]),
                                    stages=StageConfig(recompute=recompute), device="cpu",
                                    precision=PrecisionConfig(amp, "half-weights"))
                    data = SyntheticRegression(cfg["dim"], 0, "cpu")
                    dtype = engine.precision.half_dtype if engine.precision.half_weights else torch.float32
                    for step in range(cfg["steps"]):
                        with record_function("data"):
                            x, y = data.draw(step, 0, batch, inputs=engine.holds_first_stage,
                                             targets=engine.holds_last_stage, dtype=dtype)
                        with record_function("train_step"):
                            engine.train_step(x, y)
                        x = y = None
                    engine.close()
                    groups.destroy()
                    del engine, data
                prof.export_chrome_trace(path)
                out[(mode, batch)] = analyse(path)
                if not cfg["keep_traces"]:
                    os.remove(path)
    finally:
        dist.destroy_process_group()
    results.put((rank, out))


def _d(nbytes: float, dim: int) -> str:
    return f"{nbytes / dim:6.2f} D"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--micro-batches", type=int, default=8)
    p.add_argument("--batches", default="2048,8192")
    p.add_argument("--modes", default="fp32,bf16,bf16-recompute")
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--loss", choices=("mse", "python"), default="mse",
                   help="mse: the engine's C++ MSE (the driver's); python: F.mse_loss(out.float(), target.float()) "
                        "through Python, the form the C++ MSE had before it stopped keeping fp32 copies")
    p.add_argument("--min-group-d", type=float, default=0.05,
                   help="list the groups alive at the peak that hold at least this many D bytes per row")
    p.add_argument("--json", default=None, help="write the raw numbers here")
    p.add_argument("--keep-traces", default=None, metavar="DIR", help="keep the chrome traces in DIR")
    a = p.parse_args(argv)
    batches = [int(b) for b in a.batches.split(",")]
    assert len(batches) == 2 and all(b % a.micro_batches == 0 for b in batches)
    cfg = dict(dim=a.dim, depth=a.depth, micro_batches=a.micro_batches, batches=batches,
               modes=a.modes.split(","), schedule=a.schedule, steps=a.steps, loss=a.loss, keep_traces=bool(a.keep_traces))
    world = 2
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = a.keep_traces or tmp
        os.makedirs(out_dir, exist_ok=True)
        procs = [ctx.Process(target=rank_main, args=(r, world, os.path.join(tmp, "store"), cfg, out_dir, results))
                 for r in range(world)]
        for pr in procs:
            pr.start()
        per_rank = dict(results.get(timeout=1800) for _ in procs)
        for pr in procs:
            pr.join()

    sys.path.insert(0, HERE)
    from memory_model import memory_model

    b1, b2 = batches
    report = {"config": cfg, "modes": {}}
    print(f"loss {a.loss}, dim {a.dim}, depth {a.depth}, pp 2, {a.schedule}, {a.micro_batches} micro-batches, batches {b1} and "
          f"{b2}; slopes in D bytes per global row (D = dim), KB/row scaled to D = 4096")
    for mode in cfg["modes"]:
        amp, recompute = MODES[mode]
        model = memory_model(dim=a.dim, depth=a.depth, pp=2, micro_batches=a.micro_batches, schedule=a.schedule,
                             half=amp != "off", recompute=recompute)
        report["modes"][mode] = {}
        print(f"\n== {mode}")
        for rank in range(world):
            r1, r2 = per_rank[rank][(mode, b1)], per_rank[rank][(mode, b2)]
            slope = (r2["peak_bytes"] - r1["peak_bytes"]) / (b2 - b1)
            predicted = model["stages"][rank]["row_bytes"]
            print(f"rank {rank}: peak {r1['peak_bytes'] / 2**20:.1f} / {r2['peak_bytes'] / 2**20:.1f} MiB, slope "
                  f"{_d(slope, a.dim)} = {slope / a.dim * 4096 / 1e3:.1f} KB/row (model {_d(predicted, a.dim)}); "
                  f"peak at: {r2['at_peak']}")
            # What is alive at the larger batch's peak, per row of that batch. An allocation size also alive at
            # the smaller batch's peak (and not the scaled size of one there) is fixed memory (weights, fp32
            # masters, gradient buckets, scalars): summed apart.
            rows, fixed = [], 0
            micro_bytes = b2 // a.micro_batches * a.dim
            small = {n for g in r1["live"].values() for n in g["sizes"]}
            for key, g in r2["live"].items():
                sizes = {n: c for n, c in g["sizes"].items()
                         if (8 * n) % micro_bytes == 0 and (n not in small or n * b1 // b2 in small)}
                fixed += g["bytes"] - sum(n * c for n, c in sizes.items())
                if sizes:
                    shape = ", ".join(f"{c} x {n / micro_bytes:g} B/el" for n, c in sorted(sizes.items(), reverse=True))
                    rows.append((sum(n * c for n, c in sizes.items()) / b2, key, shape))
            print(f"    alive at the peak of batch {b2}, per row of it (B/el: bytes per element of one micro-batch "
                  f"[{b2 // a.micro_batches}, {a.dim}]); fixed memory apart: {fixed / 2**20:.1f} MiB")
            for per_row, key, shape in sorted(rows, reverse=True):
                if per_row / a.dim >= a.min_group_d:
                    print(f"    {_d(per_row, a.dim)}  {key}   [{shape}]")
            report["modes"][mode][rank] = {"slope_bytes_per_row": slope, "slope_d": slope / a.dim,
                                           "model_d": predicted / a.dim, "at_peak": r2["at_peak"],
                                           "live_at_peak_d_per_row": {k: b / a.dim for b, k, _ in rows}}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
