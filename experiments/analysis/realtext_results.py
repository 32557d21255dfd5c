"""The real-text run's results file from its two metrics files (experiments/passes/gpt_realtext_pass.sh writes them):

    python experiments/analysis/realtext_results.py --bf16 bf16.jsonl --fp32 fp32.jsonl --card "1 x NVIDIA H100 ..." \
        --data "..." --shape "..." --command "bash experiments/passes/gpt_realtext_pass.sh" --out RESULTS.json

The target (the GPT issue): 300 steps on a real text file, bf16 and fp32 validation losses agree within 1%. Both
runs have the same seed, so the same initial weights and the same batches; the relative difference is
|bf16 - fp32| / fp32 of the validation loss after the last step, and the largest over the curve is kept beside it.
Throughput is the median over the steps after `warmup` (evaluation time is not in a step's time).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hybrid_engine.metrics import records  # noqa: E402

TARGET = 0.01  # relative difference of the final validation losses


def read_run(path: str, warmup: int) -> dict:
    """One run's metrics file -> its curves and its median throughput after `warmup` steps."""
    found = records.read(path)
    steps = {r["step"]: r for r in records.last_steps(found)}  # a resumed run's replayed step: the last
    vals = records.validation_losses(found)
    if not steps or not vals:
        raise ValueError(f"{path}: {len(steps)} step records and {len(vals)} validation records; a run needs both")
    order = sorted(steps)
    timed = [steps[s] for s in order[warmup:]] or [steps[s] for s in order]
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    return {
        "steps": len(order),
        "train_loss": [round(steps[s]["loss"], 6) for s in order],
        "val_loss": [[s, round(vals[s], 6)] for s in sorted(vals)],
        "final_val_loss": round(vals[max(vals)], 6),
        "tokens_s": round(statistics.median(r["tokens_per_s"] for r in timed), 1),
        "step_ms": round(1e3 * statistics.median(r["step_time_s"] for r in timed), 2),
        "mfu": round(statistics.median(mfu), 4) if mfu else None,
        "peak_gib": max(max(r.get("peak_mem_gib") or [0.0]) for r in timed),
    }


def compare(bf16: dict, fp32: dict) -> dict:
    """The target's numbers: final and largest relative difference of the validation losses, step by step."""
    fp32_at = dict((s, v) for s, v in fp32["val_loss"])
    common = [(s, v, fp32_at[s]) for s, v in bf16["val_loss"] if s in fp32_at]
    if not common:
        raise ValueError("the two runs share no validation step")
    rel = [abs(a - b) / b for _, a, b in common]
    final = rel[-1]
    return {"what": "bf16 and fp32 validation losses agree within 1% after the last step",
            "final_step": common[-1][0], "final_rel_diff": round(final, 6), "max_rel_diff": round(max(rel), 6),
            "met": final <= TARGET}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bf16", required=True, help="metrics file of the bf16 run")
    parser.add_argument("--fp32", required=True, help="metrics file of the fp32 run")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the throughput (default 3)")
    parser.add_argument("--card", required=True)
    parser.add_argument("--data", required=True, help="what the text and its tokens are")
    parser.add_argument("--shape", required=True, help="the model and run, in words")
    parser.add_argument("--command", required=True)
    parser.add_argument("--wall", default="", help="'bf16_s fp32_s': each run's wall time, start-up included")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        runs = {"bf16": read_run(args.bf16, args.warmup), "fp32": read_run(args.fp32, args.warmup)}
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, seconds in zip(("bf16", "fp32"), args.wall.split()):
        runs[name]["wall_s"] = float(seconds)
    result = {"card": args.card, "command": args.command, "data": args.data, "shape": args.shape,
              "target": compare(runs["bf16"], runs["fp32"]), "runs": runs}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    t = result["target"]
    print(f"realtext: final validation loss bf16 {runs['bf16']['final_val_loss']} fp32 "
          f"{runs['fp32']['final_val_loss']}, relative difference {t['final_rel_diff']:.4%} (target 1%: "
          f"{'met' if t['met'] else 'NOT met'}); tokens/s bf16 {runs['bf16']['tokens_s']:,.0f} fp32 "
          f"{runs['fp32']['tokens_s']:,.0f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
