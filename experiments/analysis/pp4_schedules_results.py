#!/usr/bin/env python3
"""The logs of experiments/passes/pp4_schedules_pass.sh -> one results file: the GPT at pp=4 under every schedule of
the engine and of torch.distributed.pipelining (1F1B, interleaved, ZBV, DualPipeV; eager and each block compiled),
each run's tokens/s, MFU, peak memory and losses, the engine's best over torch pipelining's best, and how far each
run's losses stray from the engine's 1f1b run (same initial weights, same draw of every step).

    python experiments/analysis/pp4_schedules_results.py LOG_DIR OUT.json --card "4 x NVIDIA H100 80GB HBM3"

Engine runs are read from the driver's --metrics file (LOG_DIR/<name>.jsonl), peers from the JSON line their program
prints (LOG_DIR/<name>.log), as gpt_pp_tp_results.py reads them; a run that failed, timed out or was skipped for
time is recorded with its error and leaves out of the ratio. Which runs there are is the pass's own list
(LOG_DIR/<name>.cmd): a run the pass names engine_* is the engine's, any other a peer.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # analysis/ reads bench/, never the reverse
from gpt_pp_tp_results import LOSS_TOLERANCE, engine_run, max_rel_diff, peer_run  # noqa: E402
from launch import error_line  # noqa: E402

REFERENCE = "engine_pp4_1f1b"  # the losses every run must reproduce (bf16: within LOSS_TOLERANCE)
TARGET = 1.3  # the engine's best pp4 over torch pipelining's best: the goal the pass measures against


def read_run(log_dir: Path, name: str, skipped: set[str]) -> dict:
    cmd = log_dir / f"{name}.cmd"
    out = {"cmd": cmd.read_text().strip() if cmd.exists() else None}
    if name in skipped:
        return {**out, "error": "skipped: the pass's time budget ran out"}
    try:
        out.update(engine_run(log_dir / f"{name}.jsonl", out["cmd"] or "") if name.startswith("engine")
                   else peer_run(log_dir / f"{name}.log"))
    except (OSError, ValueError, KeyError) as exc:
        log, rc_file = log_dir / f"{name}.log", log_dir / f"{name}.rc"
        rc = int(rc_file.read_text()) if rc_file.exists() else -1
        why = "timed out" if rc == 124 else error_line(log.read_text(), rc) if log.exists() else "no log"
        out["error"] = f"{exc}; {why}"
    return out


def summarize(runs: dict) -> dict:
    """The fastest engine run over the fastest torch pipelining run, and every run's loss agreement."""
    def fastest(engine: bool):
        rated = [(r["tokens_s"], n) for n, r in runs.items() if r.get("tokens_s") and n.startswith("engine") == engine]
        return max(rated) if rated else None
    top, peer = fastest(True), fastest(False)
    value = round(top[0] / peer[0], 3) if top and peer else None
    base = runs.get(REFERENCE, {}).get("losses")
    losses = {}
    for name, run in runs.items():
        if base and run.get("losses") and name != REFERENCE:
            diff = max_rel_diff(run["losses"], base)
            losses[name] = {"max_rel_diff": float(f"{diff:.3g}"), "within": diff <= LOSS_TOLERANCE}
    return {"engine_best_vs_torch_best": {"value": value, "target": TARGET,
                                          "met": None if value is None else value >= TARGET,
                                          "engine": top[1] if top else None, "torch": peer[1] if peer else None},
            "loss_check": {"reference": REFERENCE, "max_rel_diff": LOSS_TOLERANCE, "runs": losses}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--card", default="", help="what ran it, e.g. '4 x NVIDIA H100 80GB HBM3, torch 2.11'")
    p.add_argument("--shape", default="", help="the model and batch, as the pass states them")
    a = p.parse_args(argv)
    skipped_file = a.log_dir / "skipped.txt"
    skipped = set(skipped_file.read_text().split()) if skipped_file.exists() else set()
    names = sorted(path.stem for path in a.log_dir.glob("*.cmd")) + sorted(skipped)
    runs = {name: read_run(a.log_dir, name, skipped) for name in dict.fromkeys(names)}
    data = {"card": a.card, "command": "bash experiments/passes/pp4_schedules_pass.sh", "shape": a.shape,
            "runs": runs, **summarize(runs)}
    a.out.write_text(json.dumps(data, indent=1) + "\n")
    width = max(map(len, runs), default=0)
    for name, run in runs.items():
        said = run.get("error") or f"{run['tokens_s']} tokens/s, step {run['step_ms']} ms, peak {run.get('peak_gib')}"
        print(f"{name:{width}s}  {said}")
    r = data["engine_best_vs_torch_best"]
    print(f"engine best / torch pipelining best: {r['value']} (target {r['target']}; {r['engine']} / {r['torch']})")
    for name, c in data["loss_check"]["runs"].items():
        if not c["within"]:
            print(f"loss {name}: max rel diff {c['max_rel_diff']} vs {REFERENCE}, OUTSIDE {LOSS_TOLERANCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
