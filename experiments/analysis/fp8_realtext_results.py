"""The fp8 real-text run's results file from its two metrics files (experiments/passes/fp8_realtext_pass.sh writes
them):

    python experiments/analysis/fp8_realtext_results.py --bf16 bf16.jsonl --fp8 fp8.jsonl --steps 400 \
        --card "2 x NVIDIA H100 ..." --data "..." --shape "..." \
        --command "bash experiments/passes/fp8_realtext_pass.sh" --bf16-command "torchrun ..." \
        --fp8-command "torchrun ... --fp8" --out RESULTS.json

The target (the fp8 issue): the fp8 validation loss within 1% of bf16's after the real-text run. Both runs have the
same seed, so the same initial weights and the same batches; the relative difference is |fp8 - bf16| / bf16 of the
validation loss after the last step, the largest over the curve kept beside it. A run cut before its last step
(fewer step records than --steps) leaves the target not met: its last validation is not the run's end. Throughput is
each run's median tokens/s over the steps after `warmup` (evaluation time is not in a step's time), and fp8 / bf16.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realtext_results  # noqa: E402  (one run's curves and the relative-difference rule live there)

TARGET = realtext_results.TARGET


def compare(runs: dict, steps: int | None) -> dict:
    """The target's numbers: |fp8 - bf16| / bf16 of the validation losses at their common steps, the final and the
    largest; met when the final is within TARGET and every run reached its last step."""
    # realtext_results.compare(a, b) takes |a - b| / b step by step: b is the reference, here bf16.
    found = realtext_results.compare(runs["fp8"], runs["bf16"])
    complete = steps is None or all(run["steps"] == steps for run in runs.values())
    return {"what": "fp8 validation loss within 1% of bf16's after the last step: |fp8 - bf16| / bf16",
            "target": TARGET, "final_step": found["final_step"], "final_rel_diff": found["final_rel_diff"],
            "max_rel_diff": found["max_rel_diff"], "runs_complete": complete, "met": found["met"] and complete}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bf16", required=True, help="metrics file of the bf16 run")
    parser.add_argument("--fp8", required=True, help="metrics file of the fp8 run")
    parser.add_argument("--steps", type=int, default=None, help="the steps each run was asked for")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the throughput (default 5)")
    parser.add_argument("--card", required=True)
    parser.add_argument("--data", required=True, help="what the text and its tokens are")
    parser.add_argument("--shape", required=True, help="the model and run, in words")
    parser.add_argument("--command", required=True, help="the pass's command")
    parser.add_argument("--bf16-command", required=True, help="the bf16 run's command line")
    parser.add_argument("--fp8-command", required=True, help="the fp8 run's command line")
    parser.add_argument("--wall", default="", help="'bf16_s fp8_s': each run's wall time, start-up included")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        runs = {"bf16": realtext_results.read_run(args.bf16, args.warmup),
                "fp8": realtext_results.read_run(args.fp8, args.warmup)}
        target = compare(runs, args.steps)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    runs["bf16"]["command"], runs["fp8"]["command"] = args.bf16_command, args.fp8_command
    for name, seconds in zip(("bf16", "fp8"), args.wall.split()):
        runs[name]["wall_s"] = float(seconds)
    speed = round(runs["fp8"]["tokens_s"] / runs["bf16"]["tokens_s"], 4)
    result = {"card": args.card, "command": args.command, "data": args.data, "shape": args.shape,
              "target": target, "fp8_over_bf16_tokens_s": speed, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    cut = "" if target["runs_complete"] else f" (a run stopped before step {args.steps - 1}: not met)"
    print(f"fp8 realtext: final validation loss bf16 {runs['bf16']['final_val_loss']} fp8 "
          f"{runs['fp8']['final_val_loss']} at step {target['final_step']}, relative difference "
          f"{target['final_rel_diff']:.4%} (largest {target['max_rel_diff']:.4%}; target 1%: "
          f"{'met' if target['met'] else 'NOT met'}){cut}; tokens/s bf16 {runs['bf16']['tokens_s']:,.0f} fp8 "
          f"{runs['fp8']['tokens_s']:,.0f} ({speed:.3f}x); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
