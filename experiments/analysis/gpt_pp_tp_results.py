#!/usr/bin/env python3
"""The logs of experiments/passes/gpt_pp_tp_pass.sh -> one results file: every run's tokens/s, MFU and peak memory,
the issue-#20 target ratios, and how far each run's losses stray from the 1-GPU engine run of the same flags.

    python experiments/analysis/gpt_pp_tp_results.py LOG_DIR OUT.json --card "2 x NVIDIA H100 80GB HBM3"

Engine runs are read from the driver's --metrics file (LOG_DIR/<name>.jsonl; batch, sequence length and warm-up
from its command), peers from the JSON line their program prints (LOG_DIR/<name>.log), each run's command and
exit status from LOG_DIR/<name>.cmd and .rc. A run that failed, timed out or was skipped for time is recorded
with its error and leaves the ratios that need it null.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # analysis/ reads bench/, never the reverse
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
from launch import error_line  # noqa: E402

from hybrid_engine.metrics import records  # noqa: E402


# Loss agreement: max over steps of |loss - loss_ref| / loss_ref against the 1-GPU engine run of the same flags.
LOSS_TOLERANCE = 2e-3
LOSS_TOLERANCE_WHY = (
    "bf16 keeps 8 significant bits: one rounding of the loss itself moves it by up to 2^-9 = 1.95e-3 relative. "
    "The loss is a mean over 32768 tokens per micro-batch, so the rounding inside the runs (another split of the "
    "GEMMs, another order of the TP sums, LayerNorm and residual in bf16 or fp32) averages out far below that; "
    "a run that strays by more than one rounding of the loss is suspect. Same initial weights and data: the torch "
    "peers (autocast over fp32 weights) are held to it too; Megatron draws its own initial weights, so it is not.")

# name -> (what it is, the 1-GPU engine run of the same flags whose losses it must reproduce, or None)
RUNS: dict[str, tuple[str, str | None]] = {
    "engine_1gpu": ("engine, 1 GPU, 1f1b (the reference; ran beside engine_1gpu_zb1m on the other GPU)", None),
    "engine_1gpu_zb1m": ("engine, 1 GPU, zb1 + merged W (the reference; ran beside engine_1gpu)", None),
    "engine_pp2_1f1b": ("engine pp=2, 1f1b", "engine_1gpu"),
    "engine_pp2_zb1m": ("engine pp=2, zb1 + merged W-gradients", "engine_1gpu_zb1m"),
    "engine_pp2_zb1m_ahead1": ("engine pp=2, zb1 + merged W, --lookahead 1", "engine_1gpu_zb1m"),
    "engine_tp2": ("engine tp=2", "engine_1gpu"),
    "engine_tp2_sp": ("engine tp=2 --sequence-parallel", "engine_1gpu"),
    "torch_pp": ("torch.distributed.pipelining Schedule1F1B, pp=2", "engine_1gpu"),
    "torch_pp_compile": ("torch.distributed.pipelining Schedule1F1B, pp=2, each block compiled", "engine_1gpu"),
    "dtensor_tp": ("DTensor TP, torchtitan plan, tp=2", "engine_1gpu"),
    "dtensor_tp_sp": ("DTensor TP + SequenceParallel, torchtitan plan, tp=2", "engine_1gpu"),
    "megatron_pp": ("Megatron-core pp=2, local spec, its 1F1B", None),
    "megatron_tp": ("Megatron-core tp=2, local spec", None),
    "megatron_tp_sp": ("Megatron-core tp=2 + sequence parallel, local spec", None),
}
ENGINE_PP = ("engine_pp2_1f1b", "engine_pp2_zb1m", "engine_pp2_zb1m_ahead1")
# target name -> (numerator runs (the fastest counts), denominator runs (the fastest counts), target)
TARGETS: dict[str, tuple[tuple[str, ...], tuple[str, ...], float]] = {
    "pp_engine_vs_best_torch_pipelining": (ENGINE_PP, ("torch_pp", "torch_pp_compile"), 1.3),
    "pp_engine_vs_megatron": (ENGINE_PP, ("megatron_pp",), 2.0),
    "pp_engine_1f1b_vs_best_torch_pipelining": (("engine_pp2_1f1b",), ("torch_pp", "torch_pp_compile"), 1.3),
    "tp_engine_vs_dtensor": (("engine_tp2",), ("dtensor_tp",), 1.3),
    "tp_sp_engine_vs_dtensor_sp": (("engine_tp2_sp",), ("dtensor_tp_sp",), 1.3),
    "tp_best_engine_vs_best_dtensor": (("engine_tp2", "engine_tp2_sp"), ("dtensor_tp", "dtensor_tp_sp"), 1.3),
    "tp_engine_vs_megatron": (("engine_tp2",), ("megatron_tp",), 2.0),
    "tp_sp_engine_vs_megatron_sp": (("engine_tp2_sp",), ("megatron_tp_sp",), 2.0),
    "tp_best_engine_vs_best_megatron": (("engine_tp2", "engine_tp2_sp"), ("megatron_tp", "megatron_tp_sp"), 2.0),
}


def flag(cmd: str, name: str) -> int:
    """The integer value of --name in a command line."""
    found = re.search(rf"--{name}[ =](\d+)", cmd)
    if not found:
        raise ValueError(f"no --{name} in the command {cmd!r}")
    return int(found.group(1))


def engine_run(path: Path, cmd: str) -> dict:
    """The driver's metrics: median step after the warm-up, tokens/s and MFU at that step time, peaks, losses."""
    warmup, tokens = flag(cmd, "warmup"), flag(cmd, "batch-size") * flag(cmd, "seq-len")
    steps = records.steps(records.read(path))
    timed = [s for s in steps if s["step"] >= warmup]
    if not timed:
        raise ValueError(f"{path.name}: {len(steps)} step records, none after the {warmup} warm-up steps")
    step_s = statistics.median(s["step_time_s"] for s in timed)
    tokens_s = tokens / step_s
    scale = tokens_s / timed[0]["tokens_per_s"]  # MFU and TFLOP/s are proportional to tokens/s
    return {"step_ms": round(step_s * 1e3, 2), "tokens_s": round(tokens_s),
            "tflops_per_gpu": round(timed[0]["tflops_per_gpu"] * scale, 1),
            "mfu": round(timed[0]["mfu"] * scale, 4) if timed[0].get("mfu") is not None else None,
            "peak_gib": steps[-1]["peak_mem_gib"], "losses": [s["loss"] for s in steps], "timed_steps": len(timed)}


def peer_run(path: Path) -> dict:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("{")]
    if not lines:
        raise ValueError(f"{path.name}: no JSON record")
    return json.loads(lines[-1])


def read_run(log_dir: Path, name: str) -> dict:
    cmd = log_dir / f"{name}.cmd"
    out = {"what": RUNS[name][0], "cmd": cmd.read_text().strip() if cmd.exists() else None}
    skipped = log_dir / "skipped.txt"
    if skipped.exists() and name in skipped.read_text().split():
        return {**out, "error": "skipped: the pass's time budget ran out"}
    try:
        if name.startswith("engine"):
            out.update(engine_run(log_dir / f"{name}.jsonl", out["cmd"] or ""))
        else:
            out.update(peer_run(log_dir / f"{name}.log"))
    except (OSError, ValueError, KeyError) as exc:
        log, rc_file = log_dir / f"{name}.log", log_dir / f"{name}.rc"
        rc = int(rc_file.read_text()) if rc_file.exists() else -1
        why = "timed out" if rc == 124 else error_line(log.read_text(), rc) if log.exists() else "no log"
        out["error"] = f"{exc}; {why}"
    return out


def max_rel_diff(losses: list[float], ref: list[float]) -> float:
    n = min(len(losses), len(ref))
    return max(abs(a - b) / abs(b) for a, b in zip(losses[:n], ref[:n]))


def loss_checks(runs: dict) -> dict:
    out = {}
    for name, (_, ref) in RUNS.items():
        run, base = runs.get(name, {}), runs.get(ref, {}) if ref else {}
        if ref is None or "losses" not in run or "losses" not in base:
            continue
        diff = max_rel_diff(run["losses"], base["losses"])
        out[name] = {"reference": ref, "max_rel_diff": float(f"{diff:.3g}"), "within": diff <= LOSS_TOLERANCE}
    return out


def ratios(runs: dict) -> dict:
    out = {}
    for target, (num, den, goal) in TARGETS.items():
        def fastest(names):
            rated = [(runs[n]["tokens_s"], n) for n in names if runs.get(n, {}).get("tokens_s")]
            return max(rated) if rated else None
        top, bottom = fastest(num), fastest(den)
        value = round(top[0] / bottom[0], 3) if top and bottom else None
        out[target] = {"value": value, "target": goal, "met": None if value is None else value >= goal,
                       "engine": top[1] if top else None, "peer": bottom[1] if bottom else None}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--card", default="", help="what ran it, e.g. '2 x NVIDIA H100 80GB HBM3, torch 2.11'")
    a = p.parse_args(argv)
    runs = {name: read_run(a.log_dir, name) for name in RUNS}
    reference = runs["engine_1gpu"].get("losses") or [0.0]
    data = {"card": a.card, "command": "bash experiments/passes/gpt_pp_tp_pass.sh",
            "shape": "GPT hidden 2048, 16 layers, 16 heads, seq 2048, vocab 32000, 16 sequences per step in 8 "
                     "micro-batches, AdamW (lr 3e-4, decay 0.01), bf16; 8 steps, median after 3 warm-up; every "
                     "system trains the engine's draw of each step from the same token file; MFU = (6 N + 12 L h s) "
                     "per token per GPU over 989 TFLOP/s",
            "runs": runs, "ratios": ratios(runs), "loss_check": loss_checks(runs),
            "loss_tolerance": {"max_rel_diff": LOSS_TOLERANCE, "why": LOSS_TOLERANCE_WHY,
                               "reference_decline": round((reference[0] - min(reference)) / reference[0], 4)}}
    a.out.write_text(json.dumps(data, indent=1) + "\n")
    for target, r in data["ratios"].items():
        print(f"{target:42s} {r['value']} (target {r['target']}; {r['engine']} / {r['peer']})")
    for name, c in data["loss_check"].items():
        print(f"loss {name:24s} max rel diff {c['max_rel_diff']:.3g} vs {c['reference']} "
              f"({'within' if c['within'] else 'OUTSIDE'} {LOSS_TOLERANCE})")
    for name, run in runs.items():
        if "error" in run:
            print(f"{name}: {run['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
