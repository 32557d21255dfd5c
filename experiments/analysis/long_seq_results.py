#!/usr/bin/env python3
"""The long-sequence pass's logs (experiments/passes/long_seq_pass.sh) -> one results JSON and a table.

    python experiments/analysis/long_seq_results.py LOG_DIR OUT.json --card NAME --torch VERSION

Engine runs: their --metrics file (tokens/s and MFU the median of the steps after the warm-up, peak memory per GPU
the largest any step saw), their grid and sequence read from the command budget_run logged beside it (.cmd). Peer
runs (torch_*.log): the JSON line experiments/peers/torch_cp_llama.py prints. MFU is the engine's formula
(models/llama/flops.py: 6 N + 12 L s heads d per token, the full attention square); `mfu_causal` counts the
causal half of the attention only (6 L s heads d), what the kernels compute; `kernel` is the run's --cp-kernel;
`one_gpu_longest` the longest sequence of the one-GPU runs that trained.
Targets (the long-sequence issue):
128k tokens per sequence trains on 4 GPUs; at 32k, cp4's MFU >= 90% of one GPU's at 8k; cp4 >= 1.2x torch's
context parallelism on the same grid.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hybrid_engine.metrics import records  # noqa: E402
from hybrid_engine.models.llama.config import LlamaConfig  # noqa: E402
from hybrid_engine.models.llama.flops import llama_matmul_params  # noqa: E402


def _flag(cmd: str, name: str, default: int) -> int:
    found = re.search(rf"{re.escape(name)}[ =](\d+)", cmd)
    return int(found.group(1)) if found else default


def _word(cmd: str, name: str) -> str:
    found = re.search(rf"{re.escape(name)} (\S+)", cmd)
    return found.group(1) if found else "auto"


def causal_share(cmd: str, seq: int, vocab: int) -> float:
    """(6 N + 6 L s heads d) / (6 N + 12 L s heads d) for the run's shape: mfu x this = mfu_causal."""
    cfg = LlamaConfig(vocab, _flag(cmd, "--layers", 16), _flag(cmd, "--hidden", 2048), _flag(cmd, "--heads", 32),
                      _flag(cmd, "--kv-heads", 8), _flag(cmd, "--ffn-hidden", 5632), seq)
    attention = 6.0 * cfg.layers * seq * cfg.heads * cfg.head_dim
    dense = 6.0 * llama_matmul_params(cfg)
    return (dense + attention) / (dense + 2 * attention)


def engine_row(name: str, log_dir: Path, warmup: int, vocab: int) -> dict:
    cmd = (log_dir / f"{name}.cmd").read_text()
    seq = _flag(cmd, "--seq-len", 0)
    row = {"name": name, "system": "engine", "gpus": _flag(cmd, "--nproc_per_node", 1), "cp": _flag(cmd, "--cp", 1),
           "tp": _flag(cmd, "--mp", 1), "seq": seq, "comm": _word(cmd, "--cp-comm"),
           "kernel": _word(cmd, "--cp-kernel"), "command": cmd.strip()}
    rc = (log_dir / f"{name}.rc").read_text().strip() if (log_dir / f"{name}.rc").exists() else "?"
    metrics = log_dir / f"{name}.jsonl"
    steps = records.steps(records.read(metrics)) if metrics.exists() else []
    timed = steps[warmup:]
    if rc != "0" or not timed:
        log = log_dir / f"{name}.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return row | {"error": next((l for l in lines if "error" in l.lower() or "memory" in l.lower()),
                                    lines[-1] if lines else f"exit {rc}")[:300]}
    mfu = statistics.median(s["mfu"] for s in timed) if timed[0].get("mfu") is not None else None
    return row | {"step_ms": round(statistics.median(s["step_time_s"] for s in timed) * 1e3, 1),
                  "tokens_s": round(statistics.median(s["tokens_per_s"] for s in timed)),
                  "tflops_per_gpu": round(statistics.median(s["tflops_per_gpu"] for s in timed), 1),
                  "mfu": None if mfu is None else round(mfu, 4),
                  "mfu_causal": None if mfu is None else round(mfu * causal_share(cmd, seq, vocab), 4),
                  "peak_gib_per_gpu": [round(max(s["peak_mem_gib"][r] for s in steps), 2)
                                       for r in range(len(steps[0]["peak_mem_gib"]))],
                  "losses": [round(s["loss"], 4) for s in steps]}


def peer_row(name: str, log_dir: Path, vocab: int) -> dict:
    lines = [l for l in (log_dir / f"{name}.log").read_text().splitlines() if l.startswith("{")]
    if not lines:
        return {"name": name, "system": "torch context_parallel", "error": "no result line (see its log)"}
    row = {"name": name, **json.loads(lines[-1])}
    if row.get("mfu") is not None:
        cmd = (log_dir / f"{name}.cmd").read_text()
        row["mfu_causal"] = round(row["mfu"] * causal_share(cmd, row["seq"], vocab), 4)
    return row


def targets(rows: dict) -> dict:
    def get(name, key):
        return rows.get(name, {}).get(key)

    out = {"128k trains on 4 GPUs": get("cp4_128k", "tokens_s") is not None}
    a, b = get("cp4_32k", "mfu"), get("gpu1_8k", "mfu")
    out["cp4 32k MFU / 1 GPU 8k MFU >= 0.9"] = None if not (a and b) else round(a / b, 3)
    a, b = get("cp4_32k", "tokens_s"), get("torch_cp4_32k", "tokens_s")
    out["cp4 32k tokens/s / torch context_parallel >= 1.2"] = None if not (a and b) else round(a / b, 3)
    a, b = get("cp4_32k", "tokens_s"), get("cp4_32k_flash", "tokens_s")
    out["cp4 32k: blocks by auto's kernel over flash's (tokens/s)"] = None if not (a and b) else round(a / b, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log_dir")
    p.add_argument("out")
    p.add_argument("--card", default="?")
    p.add_argument("--torch", default="?")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32000)
    a = p.parse_args()
    log_dir = Path(a.log_dir)
    rows = {}
    for cmd in sorted(log_dir.glob("*.cmd"), key=lambda f: f.stat().st_mtime):
        name = cmd.stem
        rows[name] = peer_row(name, log_dir, a.vocab) if name.startswith("torch_") else engine_row(
            name, log_dir, a.warmup, a.vocab)
    skipped = (log_dir / "skipped.txt").read_text().split() if (log_dir / "skipped.txt").exists() else []
    trained = [r["seq"] for name, r in rows.items() if name.startswith("gpu1_") and "error" not in r]
    result = {"card": a.card, "torch": a.torch, "runs": list(rows.values()), "skipped": skipped,
              "one_gpu_longest": max(trained, default=None), "targets": targets(rows)}
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"{'run':<22}{'gpus':>5}{'cp':>4}{'tp':>4}{'seq':>8}{'tokens/s':>11}{'MFU':>8}{'causal':>8}  peak GiB/GPU")
    for r in rows.values():
        if "error" in r:
            print(f"{r['name']:<22} FAILED: {r['error']}")
            continue
        mfu = "-" if r.get("mfu") is None else f"{r['mfu']:.3f}"
        causal = "-" if r.get("mfu_causal") is None else f"{r['mfu_causal']:.3f}"
        peaks = r.get("peak_gib_per_gpu", r.get("peak_gib"))
        print(f"{r['name']:<22}{r.get('gpus', '?'):>5}{r.get('cp', '?'):>4}{r.get('tp', 1):>4}{r.get('seq', '?'):>8}"
              f"{r.get('tokens_s', '?'):>11}{mfu:>8}{causal:>8}  {peaks}")
    print(f"one GPU's longest sequence that trained: {result['one_gpu_longest']}")
    for goal, value in result["targets"].items():
        print(f"target {goal}: {value}")
    if skipped:
        print(f"skipped (budget): {' '.join(skipped)}")


if __name__ == "__main__":
    main()
