"""The planner pass's logs (experiments/passes/plan_pass.sh) as one results file: for every model (L, C, G; pp4 on
four GPUs) the auto plan's step time over the best hand-tuned run's (1.0: the planner found the best; above: how
much slower), and for every run measured against predicted step time and peak memory (the --metrics summary
record).

    python experiments/analysis/plan_results.py LOG_DIR OUT.json --card "NVIDIA H200"
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def summary_of(path: Path) -> dict | None:
    """The summary record of a metrics file (its last line that has one), or None for a run that did not finish."""
    found = None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "summary" in record:
            found = record["summary"]
    return found


def plan_line(log: Path) -> str | None:
    if not log.exists():
        return None
    return next((line for line in log.read_text().splitlines() if line.startswith("plan: ")), None)


def collect(res: Path) -> dict:
    """{run name: its summary (+ the plan line of an auto run)}; runs without a summary get an error."""
    runs = {}
    for path in sorted(res.glob("*.jsonl")):
        name = path.stem
        s = summary_of(path)
        if s is None:
            runs[name] = {"error": "no summary (the run failed or was skipped)"}
            continue
        runs[name] = dict(s, step_error=round(s["step_time_s"] / s["predicted_step_time_s"] - 1, 4),
                          peak_error=round(max(s["peak_mem_gib"], 1e-9) / max(s["predicted_peak_mem_gib"], 1e-9) - 1,
                                           4))
        if name.endswith("_auto"):
            runs[name]["plan_line"] = plan_line(path.with_suffix(".log"))
    return runs


def ratios(runs: dict) -> dict:
    """Per model (the run names' prefix before _auto): auto's step time over the best hand-tuned run's."""
    out = {}
    for name, run in runs.items():
        if not name.endswith("_auto") or "error" in run:
            continue
        prefix = name[: -len("auto")]
        tuned = {n: r["step_time_s"] for n, r in runs.items() if n.startswith(prefix) and n != name and "error" not in r}
        if not tuned:
            continue
        best = min(tuned, key=tuned.get)
        out[prefix.rstrip("_")] = {"auto_over_best": round(run["step_time_s"] / tuned[best], 4), "best": best,
                                   "auto_plan": run.get("plan"), "best_step_s": tuned[best],
                                   "auto_step_s": run["step_time_s"]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--card", default="unknown")
    args = p.parse_args(argv)
    runs = collect(args.log_dir)
    result = {"card": args.card, "runs": runs, "auto_vs_best": ratios(runs)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for model, r in result["auto_vs_best"].items():
        print(f"{model}: auto {r['auto_step_s'] * 1e3:.3g} ms ({r['auto_plan']}) = {r['auto_over_best']:.2f}x the best "
              f"hand-tuned ({r['best']}, {r['best_step_s'] * 1e3:.3g} ms)")
    for name, r in runs.items():
        if "error" not in r:
            print(f"{name}: step {r['step_error']:+.0%} of predicted, peak {r['peak_error']:+.0%} of predicted")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
