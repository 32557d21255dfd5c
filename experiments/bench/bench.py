#!/usr/bin/env python3
"""One command for the whole comparison (issue #6): base code, torch peer and engine on the GPUs present.

    python experiments/bench/bench.py [--configs C,L,X] [--quick] [--only base,peer,engine] [--out experiments/results/]

1. probe_card.py (own process): card, GEMM peak per precision, HBM copy bandwidth;
2. the matrix, group by group in priority order; a group is one config and precision with the systems back
   to back (base, peer, engine), so drift hits all of them alike. Every run is a fresh torchrun (fresh process
   group) with a timeout; a failed or timed-out run is recorded as {"error": ...}, never a crash. When
   --time-budget runs out, the remaining runs are recorded as skipped;
3. writes experiments/results/<date>-<gpus>x<card>[-quick].json after every run:
   {"meta": {...}, "runs": [...], "ratios": {target: value}, "ratio_details": {...}}
   and prints a table of runs and targets (bench_analysis.py defines every derived number).

The engine is the real driver (hybrid_engine.py) with --metrics; its flags come from the tables below, one
line per flag, and a flag the driver lacks turns that run into a clear error. `--tiny --device cpu` runs the
same matrix at toy sizes on CPU + gloo (tests); `--dry-run` prints the commands without running them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PEERS = HERE.parent / "peers"
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(REPO))
sys.path.insert(2, str(PEERS))  # common.record: the engine's record is built by the programs' own function

from bench_analysis import DEFINITIONS, annotate, compute_ratios, format_table  # noqa: E402
from launch import (child_env, driver_flags, error_line, execute, free_port, missing_flags, shown,  # noqa: E402
                    torchrun, worker_stderr)


@dataclass(frozen=True)
class Config:
    dim: int
    depth: int
    batch: int
    micro: int
    steps: int  # warm-up included, as the driver counts
    warmup: int


CONFIGS = {
    "C": Config(8192, 8, 64, 4, steps=6, warmup=2),
    "L": Config(8192, 16, 1024, 8, steps=6, warmup=2),
    # L with twice the global batch: each of 2 DP replicas then runs exactly L's micro-batches (weak scaling)
    "Lw": Config(8192, 16, 2048, 8, steps=6, warmup=2),
    "X": Config(8192, 16, 16384, 8, steps=4, warmup=1),
}
TINY = Config(32, 4, 16, 4, steps=3, warmup=1)  # --tiny: every config at toy size (CPU tests)

# ---- flag tables: how each system is told a precision / schedule / variant (one line per flag) ----------
AMP = {"fp32": "off", "fp16": "fp16", "bf16": "bf16"}
PROGRAM_PREC = {prec: ("--amp", amp) for prec, amp in AMP.items()}  # base and peer
ENGINE_PREC = {"fp32": (), "fp16": ("--amp", "fp16"), "bf16": ("--amp", "bf16")}
ENGINE_SCHEDULE = {
    "naive": ("--schedule", "naive"),
    "gpipe": ("--schedule", "gpipe"),
    "1f1b": ("--schedule", "1f1b"),
    "interleaved": ("--schedule", "interleaved", "--virtual-stages", "2"),
    # the engine's fastest pipeline: zb1 with W merged into one GEMM per layer and one lookahead forward
    "zb1": ("--schedule", "zb1", "--merge-wgrad", "--lookahead", "1"),
    "single": (), "dp": (), "tp": (),  # pp = 1: no schedule
}
ENGINE_VARIANT = {
    "": (),
    "autocast": ("--amp-impl", "autocast"),
    "recompute": ("--recompute",),
    "nofuse": ("--stage-impl", "autograd"),  # was --no-fuse: stages module by module through autograd
}
ENGINE_ALWAYS = ("--quiet",)
ENGINE_TRACE = "--trace"  # optional: the driver's own measured timeline (last step), for these modes at pp > 1
TRACED_MODES = {"1f1b"}


@dataclass(frozen=True)
class Spec:
    system: str  # base | peer | engine
    mode: str
    config: str
    prec: str
    dp: int = 1
    pp: int = 1
    mp: int = 1
    variant: str = ""

    @property
    def gpus(self) -> int:
        return 2 * self.dp if self.system == "base" else self.dp * self.pp * self.mp

    @property
    def nproc(self) -> int:
        return self.dp if self.system == "base" else self.gpus


def B(dp: int = 1) -> dict:
    return dict(system="base", mode="practical10", dp=dp, pp=2)


def P(mode: str) -> dict:
    return dict(system="peer", mode=mode, pp=2 if mode in ("gpipe", "1f1b", "interleaved") else 1,
                mp=2 if mode == "tp" else 1)


def E(mode: str, *, dp: int = 1, variant: str = "") -> dict:
    pp = 2 if mode in ("naive", "gpipe", "1f1b", "interleaved", "zb1") else 1
    mp = 2 if mode == "tp" else 1
    return dict(system="engine", mode=mode, dp=dp, pp=pp, mp=mp, variant=variant)


PP_TRIO = [B(), P("1f1b"), E("1f1b"), E("zb1")]
# Priority order: the runs behind the issue-#6 targets first; a short --time-budget drops the tail.
DEFAULT_GROUPS = [
    ("L", "fp16", PP_TRIO),
    ("L", "fp32", PP_TRIO),
    ("C", "fp16", PP_TRIO),
    ("X", "fp16", [P("1f1b"), E("1f1b"), E("zb1"), P("single"), E("single")]),
    ("L", "fp16", [P("single"), E("single"), E("dp", dp=2)]),
    ("Lw", "fp16", [E("dp", dp=2)]),
    ("L", "fp16", [P("tp"), E("tp")]),
    ("L", "fp16", [P("gpipe"), P("interleaved"), E("gpipe"), E("interleaved"), E("1f1b", variant="autocast"),
                   E("1f1b", variant="recompute")]),
    ("L", "bf16", PP_TRIO),
    ("L", "fp32", [P("single"), E("single")]),
    ("C", "fp32", [B(), P("1f1b"), E("1f1b")]),
    ("L", "bf16", [P("tp"), E("tp")]),
    ("L", "fp16", [B(dp=2), dict(system="engine", mode="1f1b", dp=2, pp=2)]),  # 4 GPUs only
]
QUICK_GROUPS = [("L", "fp16", [B(), P("1f1b"), E("1f1b")]), ("L", "fp32", [B(), P("1f1b"), E("1f1b")])]


def plan(groups, configs: list[str], systems: list[str], precs: list[str]) -> list[Spec]:
    specs: list[Spec] = []
    for config, prec, members in groups:
        if config not in configs or prec not in precs:
            continue
        for m in members:
            if m["system"] in systems:
                spec = Spec(config=config, prec=prec, **m)
                if spec not in specs:
                    specs.append(spec)
    return specs


def command(spec: Spec, cfg: Config, *, device: str, metrics: str, engine_extra: tuple[str, ...] = (),
            seed: int = 0, port: int | None = None, trace: str | None = None) -> list[str]:
    """[python, -m, torch.distributed.run, torchrun flags..., script, flags...] for one run."""
    launcher = torchrun(spec.nproc, port)
    # --micro-batches counts per DP rank: a DP run splits the config's micro-batches over its replicas so every
    # GPU sees the same micro-batch rows as the 1-GPU run it is compared with (scaling efficiency)
    micro = max(1, cfg.micro // spec.dp) if spec.system == "engine" else cfg.micro
    shape = ["--dim", cfg.dim, "--depth", cfg.depth, "--batch-size", cfg.batch, "--micro-batches", micro,
             "--steps", cfg.steps, "--warmup", cfg.warmup, "--seed", seed]
    dev = ["--device", "cpu"] if device == "cpu" else []
    if spec.system == "base":
        args = [str(PEERS / "baseline_practical10.py"), *shape, *PROGRAM_PREC[spec.prec], *dev]
    elif spec.system == "peer":
        args = [str(PEERS / "peer_torch_pipelining.py"), "--mode", spec.mode, *shape, *PROGRAM_PREC[spec.prec], *dev]
    else:
        args = [str(REPO / "hybrid_engine.py"), "--dp", spec.dp, "--pp", spec.pp, "--mp", spec.mp,
                *ENGINE_SCHEDULE[spec.mode], *shape, *ENGINE_PREC[spec.prec], *ENGINE_VARIANT[spec.variant],
                *engine_extra, *dev, *ENGINE_ALWAYS, "--metrics", metrics]
        if trace and spec.mode in TRACED_MODES and spec.pp > 1 and not spec.variant:
            args += [ENGINE_TRACE, trace]
    return launcher + [str(a) for a in args]


def engine_record(spec: Spec, cfg: Config, metrics_path: str, trace_json: str | None = None) -> dict:
    """The run's record from the driver's --metrics file. trace_json: the run's written trace, to compute the
    calibrated bubble when the driver that ran it did not yet report one."""
    from common import record

    from hybrid_engine.metrics import records

    lines = records.read(metrics_path)
    steps = records.steps(lines)
    timed = [s["step_time_s"] for s in steps if s["step"] >= cfg.warmup]
    if not timed:
        raise ValueError(f"the driver wrote {len(steps)} step records, none after the {cfg.warmup} warm-up steps")
    extra = {"skipped_steps": sum(1 for s in steps if s.get("skipped"))}
    if steps[-1].get("loss_scale") is not None:
        extra["loss_scale"] = steps[-1]["loss_scale"]
    trace = next((rec["trace"] for rec in lines if "trace" in rec), None)
    if trace:  # the driver's timeline of the last step (hybrid_engine/metrics/trace.py defines its bubble)
        extra.update(bubble_traced=round(trace["measured_bubble"], 4),
                     bubble_traced_simulated=round(trace["simulated_bubble"], 4))
        calibrated = trace.get("calibrated_bubble")
        if calibrated is None and trace_json and Path(trace_json).exists():
            from hybrid_engine.metrics.trace import calibrated_bubble, rows_of_chrome_trace
            calibrated = calibrated_bubble(rows_of_chrome_trace(trace_json), trace["schedule"],
                                           trace["micro_batches"], 1)
        if calibrated is not None:
            extra["bubble_calibrated"] = round(calibrated, 4)
    return record(system="engine", mode=spec.mode, prec=spec.prec, gpus=spec.gpus, dp=spec.dp, pp=spec.pp,
                  mp=spec.mp, dim=cfg.dim, depth=cfg.depth, batch=cfg.batch, micro=cfg.micro, times=timed,
                  losses=[s["loss"] for s in steps], peaks=steps[-1]["peak_mem_gib"], **extra)


def program_record(stdout: str) -> dict:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            rec = json.loads(line)
            if "system" in rec:
                return rec
    raise ValueError("no JSON result line on stdout")


def trace_path(args, spec: Spec, known_flags: set[str]) -> str | None:
    """Where the driver writes this run's timeline (kept beside the results), or None: not traced."""
    if not getattr(args, "trace_dir", None) or ENGINE_TRACE not in known_flags:
        return None
    Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    return str(Path(args.trace_dir) / f"{spec.config}_{spec.prec}_{spec.mode}_pp{spec.pp}")


def run_one(spec: Spec, cfg: Config, args, known_flags: set[str], tmp: str) -> dict:
    metrics = os.path.join(tmp, f"m{time.monotonic_ns()}.jsonl")
    cmd = command(spec, cfg, device=args.device, metrics=metrics, engine_extra=tuple(shlex.split(args.engine_flags)),
                  port=free_port(), trace=trace_path(args, spec, known_flags) if spec.system == "engine" else None)
    result: dict = {**asdict(spec), "gpus": spec.gpus, "cmd": shown(cmd)}
    if spec.system == "engine" and getattr(args, "driver_error", None):
        result["error"] = args.driver_error
        return result
    if spec.system == "engine":
        lacking = missing_flags(cmd, known_flags)
        if lacking:
            result["error"] = (f"hybrid_engine.py has no {', '.join(lacking)} flag: this bench needs it "
                               f"(bench.py ENGINE_* tables)")
            return result
    rc, out, err, wall = execute(cmd, child_env(args.device == "cpu"), args.run_timeout)
    result["wall_s"] = round(wall, 1)
    try:
        if rc != 0:
            raise RuntimeError(error_line(err, rc))
        rec = engine_record(spec, cfg, metrics) if spec.system == "engine" else program_record(out)
        result.update({k: v for k, v in rec.items() if k not in asdict(spec)})
    except Exception as exc:  # noqa: BLE001 - a failed run is a record, not the end of the benchmark
        result["error"] = str(exc)[:500]
        result["stderr_tail"] = worker_stderr(err)
    return result


def probe(device: str) -> dict:
    cmd = [sys.executable, str(HERE / "probe_card.py")] + (["--device", "cpu"] if device == "cpu" else [])
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"bench.py: error: probe_card.py failed: {error_line(done.stderr, done.returncode)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def output_path(out_dir: Path, card: str, gpus: int, quick: bool) -> Path:
    stem = f"{datetime.date.today().isoformat()}-{gpus}x{card}" + ("-quick" if quick else "")
    path, n = out_dir / f"{stem}.json", 2
    while path.exists():
        path, n = out_dir / f"{stem}-{n}.json", n + 1
    return path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="C,L,X", help="comma list of C, L, X")
    p.add_argument("--only", default="base,peer,engine", help="comma list of systems to run")
    p.add_argument("--precs", default="fp32,fp16,bf16", help="comma list of precisions to run")
    p.add_argument("--quick", action="store_true", help="only L, fp16 + fp32, 1F1B at pp=2: base, peer, engine")
    p.add_argument("--out", default=str(HERE.parent / "results"), help="directory for the results JSON")
    p.add_argument("--time-budget", type=float, default=420.0,
                   help="seconds; runs not started by then are recorded as skipped")
    p.add_argument("--run-timeout", type=float, default=120.0, help="seconds one run may take")
    p.add_argument("--engine-flags", default="", help="extra driver flags for every engine run (quoted)")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto", help="cpu: gloo ranks, for tests")
    p.add_argument("--cpu-ranks", type=int, default=2, help="--device cpu: 'GPUs' to plan for")
    p.add_argument("--tiny", action="store_true", help="every config at dim 32, depth 4 (CPU tests)")
    p.add_argument("--no-trace", action="store_true",
                   help="no --trace for the engine's 1F1B runs (default: traced, timelines kept beside the results)")
    p.add_argument("--dry-run", action="store_true", help="print the planned commands and exit")
    p.add_argument("--gpus", type=int, default=None, help="--dry-run: plan for this many GPUs (default 2)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        raise SystemExit(f"bench.py: error: unknown config(s) {bad}; known: {', '.join(CONFIGS)}")
    cfg_of = {c: (TINY if args.tiny else CONFIGS[c]) for c in CONFIGS}
    specs = plan(QUICK_GROUPS if args.quick else DEFAULT_GROUPS, configs, args.only.split(","), args.precs.split(","))
    if args.device == "cpu" and any(s.prec == "fp16" for s in specs):
        # fp16 matrix products do not run on the CPU (the driver refuses them): plan none rather than report errors
        specs = [s for s in specs if s.prec != "fp16"]
        print("bench: fp16 needs CUDA GPUs: its runs are left out on the CPU", flush=True)
    if args.dry_run:
        gpus = args.gpus or 2
        for spec in specs:
            note = "" if spec.gpus <= gpus else f"   # skipped: needs {spec.gpus} GPUs"
            cmd = command(spec, cfg_of[spec.config], device=args.device, metrics=f"/tmp/{spec.system}.jsonl",
                          engine_extra=tuple(shlex.split(args.engine_flags)))
            print(shown(cmd) + note)
        return 0

    meta = probe(args.device)
    gpus = args.cpu_ranks if args.device == "cpu" else meta["gpus"]
    if gpus == 0:
        raise SystemExit("bench.py: error: no CUDA GPU visible (use --device cpu --tiny to test on the CPU)")
    meta.update(date=datetime.date.today().isoformat(), gpus=gpus, python=sys.version.split()[0],
                argv=sys.argv[1:], configs={c: asdict(cfg_of[c]) for c in configs}, definitions=DEFINITIONS)
    known, args.driver_error = set(), None
    if any(s.system == "engine" for s in specs):
        try:
            known = driver_flags()
        except RuntimeError as exc:  # e.g. the extension is not built: every engine run says so
            args.driver_error = meta["driver_error"] = str(exc)
            print(f"bench: {exc}", flush=True)
    meta["driver_flags_missing"] = [] if args.driver_error else sorted({f for s in specs if s.system == "engine"
                                           for f in missing_flags(command(s, cfg_of[s.config], device=args.device,
                                                                          metrics="m"), known)})
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = output_path(out_dir, meta["card"], gpus, args.quick)
    args.trace_dir = None if args.no_trace else str(path.with_suffix("")) + "-traces"
    print(f"bench: {len(specs)} runs on {gpus} x {meta['card_full']}, results -> {path}", flush=True)
    if meta["driver_flags_missing"]:
        print(f"bench: the driver lacks {meta['driver_flags_missing']}: those engine runs will be errors", flush=True)

    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(specs):
            if spec.gpus > gpus:
                runs.append({**asdict(spec), "gpus": spec.gpus, "skipped": f"needs {spec.gpus} GPUs"})
                continue
            if time.monotonic() - start > args.time_budget:
                runs.append({**asdict(spec), "gpus": spec.gpus, "skipped": "time budget spent"})
                continue
            run = run_one(spec, cfg_of[spec.config], args, known, tmp)
            runs.append(run)
            status = run["error"][:150] if "error" in run else f"{run['step_ms']:.2f} ms {run['samples_s']:.0f}/s"
            print(f"[{i + 1}/{len(specs)} {time.monotonic() - start:3.0f}s] {spec.system} {spec.mode}"
                  f"{'+' + spec.variant if spec.variant else ''} {spec.config} {spec.prec} "
                  f"d{spec.dp}p{spec.pp}m{spec.mp}: {status}", flush=True)
            write_results(path, meta, runs, start)
    ratios = write_results(path, meta, runs, start)
    print(format_table(runs, *ratios))
    print(f"results written to {path} ({time.monotonic() - start:.0f} s)")
    return 0


def write_results(path: Path, meta: dict, runs: list[dict], start: float) -> tuple[dict, dict]:
    annotate(runs, meta.get("gemm_peak_tflops", {}), meta.get("card_full", ""))
    ratios, details = compute_ratios(runs, meta)
    meta["elapsed_s"] = round(time.monotonic() - start, 1)
    path.write_text(json.dumps({"meta": meta, "runs": runs, "ratios": ratios, "ratio_details": details}, indent=1))
    return ratios, details


if __name__ == "__main__":
    sys.exit(main())
