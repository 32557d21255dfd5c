"""The Llama-against-GPT real-text run's results file from its metrics files and logs
(experiments/passes/llama_text_cpu.sh writes them):

    python experiments/analysis/llama_text_results.py --gpt gpt.jsonl --llama llama.jsonl --gpt-log gpt.log \
        --llama-log llama.log --card "CPU: ..." --data "..." --recipe "..." --command "bash ..." --out RESULTS.json

The target (the Llama issue): a small Llama trained on a text file with BPE learns, its validation loss beside the
GPT's at the same parameter count and steps. Judged here as two checks, each in the file with its numbers:
"learns" -- the Llama's final validation loss is at least LEARNED_NATS below ln(vocabulary), the loss of a uniform
guess, which both models start at; "beside" -- it is within BESIDE (relative) of the GPT's, or below it. The
parameter counts and the vocabulary come from each run's start-up `model:` line, so a mismatched pair shows.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

from realtext_results import read_run

LEARNED_NATS = 2.0
BESIDE = 0.05
MODEL_LINE = re.compile(r"^model: (GPT|Llama), .*?vocab (\d+), .*?([0-9.]+)M parameters", re.M)


def read_model_line(path: str) -> dict:
    """{model, vocab, params_m} from a run's log."""
    with open(path, encoding="utf-8", errors="replace") as f:
        match = MODEL_LINE.search(f.read())
    if not match:
        raise ValueError(f"{path}: no 'model: ... vocab N, ... NM parameters' line")
    return {"model": match.group(1), "vocab": int(match.group(2)), "params_m": float(match.group(3)),
            "model_line": match.group(0)}


def compare(gpt: dict, llama: dict, vocab: int) -> dict:
    """The two checks and the curves side by side at the validation steps both runs share."""
    gpt_at = dict((s, v) for s, v in gpt["val_loss"])
    curve = [[s, v, gpt_at[s]] for s, v in llama["val_loss"] if s in gpt_at]
    if not curve:
        raise ValueError("the two runs share no validation step")
    step, llama_final, gpt_final = curve[-1]
    uniform = math.log(vocab)
    rel = (llama_final - gpt_final) / gpt_final
    return {"what": f"the Llama learns (final validation loss >= {LEARNED_NATS:g} nats below ln(vocabulary)) and "
                    f"sits beside the GPT's (within {BESIDE:.0%} of it, or below it) at the same parameter count "
                    "and steps",
            "final_step": step, "llama_final_val_loss": llama_final, "gpt_final_val_loss": gpt_final,
            "uniform_loss": round(uniform, 6), "llama_rel_to_gpt": round(rel, 6),
            "learns": uniform - llama_final >= LEARNED_NATS, "beside": rel <= BESIDE,
            "val_loss_llama_gpt": curve}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("gpt", "llama"):
        parser.add_argument(f"--{name}", required=True, help=f"metrics file of the {name} run")
        parser.add_argument(f"--{name}-log", required=True, help=f"stdout of the {name} run (its model: line)")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the throughput (default 3)")
    parser.add_argument("--card", required=True)
    parser.add_argument("--data", required=True, help="what the text and its tokens are")
    parser.add_argument("--recipe", required=True, help="the shape both share and the optimizer, in words")
    parser.add_argument("--command", required=True)
    parser.add_argument("--wall", default="", help="'gpt_s llama_s': each run's wall time, start-up included")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        runs = {}
        for name in ("gpt", "llama"):
            runs[name] = {**read_model_line(getattr(args, f"{name}_log")), **read_run(getattr(args, name), args.warmup)}
        if runs["gpt"]["vocab"] != runs["llama"]["vocab"]:
            raise ValueError(f"the runs' vocabularies differ ({runs['gpt']['vocab']} and {runs['llama']['vocab']})")
        if runs["gpt"]["steps"] != runs["llama"]["steps"]:
            raise ValueError(f"the runs' step counts differ ({runs['gpt']['steps']} and {runs['llama']['steps']})")
        target = compare(runs["gpt"], runs["llama"], runs["llama"]["vocab"])
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, seconds in zip(("gpt", "llama"), args.wall.split()):
        runs[name]["wall_s"] = float(seconds)
    result = {"card": args.card, "command": args.command, "data": args.data, "recipe": args.recipe,
              "target": target, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    t = target
    print(f"llama_text: step {t['final_step']} validation loss Llama {t['llama_final_val_loss']} "
          f"({runs['llama']['params_m']}M parameters) GPT {t['gpt_final_val_loss']} ({runs['gpt']['params_m']}M), "
          f"Llama {t['llama_rel_to_gpt']:+.2%} against the GPT, uniform {t['uniform_loss']:.3f}; learns: "
          f"{'met' if t['learns'] else 'NOT met'}, beside the GPT: {'met' if t['beside'] else 'NOT met'}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
