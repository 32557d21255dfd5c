"""Section 7.3, the GPT-1B shape at pp=2 and tp=2 on two GPUs beside torch.distributed.pipelining, DTensor TP and
Megatron-core (issue #20): one -gpt-pp-tp.json per card (experiments/passes/gpt_pp_tp_pass.sh through
experiments/analysis/gpt_pp_tp_results.py). Every cell is computed from the file's records: tokens/s, MFU, step ms, peak
memory per rank, the loss check against the 1-GPU engine run, and each target ratio recomputed as the engine run's
tokens/s over the peer's, with its verdict against the file's goal."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .data import NOT_RUN, finite
from .gpt_data import GptFile
from .render import Block
from .tables import DASH, Table, ms, pct, rate, rel, times

RUN = "bash experiments/passes/gpt_pp_tp_pass.sh"


def _shape_int(shape: str, pattern: str) -> Optional[int]:
    m = re.search(pattern, shape or "")
    return int(m[1]) if m else None


def tokens_per_s(rec: Optional[dict], f: GptFile) -> tuple[Optional[float], bool]:
    """The record's tokens/s, or (where it holds none) batch x seq tokens per step over its step time, batch and
    seq taken from the record or else from the file's `shape` ("seq 2048", "16 sequences per step"). The flag says
    the value was computed here."""
    if not isinstance(rec, dict):
        return None, False
    if finite(rec.get("tokens_s")):
        return float(rec["tokens_s"]), False
    shape = f.data.get("shape", "")
    batch = rec.get("batch") if finite(rec.get("batch")) else _shape_int(shape, r"(\d+) sequences per step")
    seq = rec.get("seq") if finite(rec.get("seq")) else _shape_int(shape, r"\bseq (\d+)")
    step = rec.get("step_ms")
    if batch and seq and finite(step) and step > 0:
        return batch * seq / (step / 1000.0), True
    return None, False


def _grid(name: str, rec: dict) -> str:
    pp = rec.get("pp") or int((re.search(r"pp(\d+)", name) or [None, 1])[1])
    tp = rec.get("tp") or int((re.search(r"tp(\d+)", name) or [None, 1])[1])
    return f"pp{pp} tp{tp}" + (" SP" if rec.get("sequence_parallel") or name.endswith("_sp") else "")


def _peaks(rec: dict) -> list:
    peak = rec.get("peak_gib")
    return peak if isinstance(peak, list) else [peak] if finite(peak) else []


def _loss_cell(f: GptFile, name: str) -> str:
    check = (f.data.get("loss_check") or {}).get(name)
    if not isinstance(check, dict) or not finite(check.get("max_rel_diff")):
        return DASH
    tol = (f.data.get("loss_tolerance") or {}).get("max_rel_diff")
    within = check["max_rel_diff"] <= tol if finite(tol) else check.get("within")
    return f"{check['max_rel_diff']:.1e} " + {True: "ok", False: "OVER"}.get(within, "?")


def runs_table(f: GptFile, root: Path) -> Table:
    cols = ["run", "what", "grid", "GPUs", "step ms", "tokens/s", "MFU", "peak GiB per rank", "loss vs 1 GPU"]
    t = Table(f"7. GPT-1B at pp=2 and tp=2 on 2 GPUs beside torch pipelining, DTensor TP and Megatron-core, "
              f"{f.card}", cols, [])
    computed = []
    for name, rec in f.data["runs"].items():
        tps, derived = tokens_per_s(rec, f)
        what = str((rec or {}).get("what", name)).split(" (")[0] if isinstance(rec, dict) else name
        if tps is None:
            t.rows.append([name, what] + [NOT_RUN] * (len(cols) - 2))
            t.shade.append(True)
            continue
        computed += [name] if derived else []
        peaks = _peaks(rec)
        t.rows.append([name, what, _grid(name, rec), str(rec.get("gpus") or len(peaks) or "?"), ms(rec.get("step_ms")),
                       rate(tps) + ("*" if derived else ""), pct(rec.get("mfu")),
                       ", ".join(f"{p:.1f}" for p in peaks if finite(p)) or DASH, _loss_cell(f, name)])
        t.shade.append(False)
    tol = f.data.get("loss_tolerance") or {}
    refs = sorted({c.get("reference", "?") for c in (f.data.get("loss_check") or {}).values() if isinstance(c, dict)})
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', f.card)}; {f.data.get('command', '?')})",
               f"shape: {f.data.get('shape', '?')}",
               "loss vs 1 GPU: the largest relative difference of the run's per-step losses from its 1-GPU engine "
               f"reference ({', '.join(refs) or '?'}, as named in the file's loss_check); tolerance "
               f"{tol.get('max_rel_diff', '?')}: {tol.get('why', '?')}"]
    unchecked = [n for n, r in f.data["runs"].items() if _loss_cell(f, n) == DASH and tokens_per_s(r, f)[0]]
    if unchecked:
        t.notes.append(f"no loss check (–): {', '.join(unchecked)} (the references themselves, and runs the file does "
                       "not hold to the tolerance).")
    if computed:
        t.notes.append(f"* tokens/s computed here as batch x seq over step ms (the record holds none): "
                       f"{', '.join(computed)}.")
    return t


def ratio_rows(f: GptFile) -> list[dict]:
    """Each target of the file's "ratios", its value recomputed from the two records it names."""
    out = []
    runs = f.data["runs"]
    for key, r in (f.data.get("ratios") or {}).items():
        if not isinstance(r, dict):
            continue
        eng, _ = tokens_per_s(runs.get(r.get("engine")), f)
        peer, _ = tokens_per_s(runs.get(r.get("peer")), f)
        value = eng / peer if eng and peer else None
        target = r.get("target")
        met = value >= target if value is not None and finite(target) else None
        out.append({"key": key, "engine": r.get("engine", "?"), "peer": r.get("peer", "?"), "engine_tps": eng,
                    "peer_tps": peer, "value": value, "target": target, "met": met, "file_value": r.get("value")})
    return out


def _verdict(met: Optional[bool]) -> str:
    return {True: "met", False: "missed"}.get(met, DASH)


def ratios_table(f: GptFile, root: Path) -> Table:
    cols = ["target", "engine run", "peer run", "engine tokens/s", "peer tokens/s", "engine / peer", "goal", "verdict"]
    t = Table(f"7. GPT-1B at pp=2 and tp=2: the targets, {f.card}", cols, [])
    rows = ratio_rows(f)
    differ = [r["key"] for r in rows if not (finite(r["file_value"]) and r["value"] is not None
                                             and abs(r["value"] - r["file_value"]) <= 0.0006)]
    for r in rows:
        t.rows.append([r["key"], r["engine"], r["peer"], rate(r["engine_tps"]), rate(r["peer_tps"]), times(r["value"]),
                       f">= {r['target']:.2f}x" if finite(r["target"]) else DASH, _verdict(r["met"])])
        t.shade.append(r["value"] is None)
    t.notes = [f"source: {rel(f.path, root)} ({f.data.get('card', f.card)}; {f.data.get('command', '?')})",
               "engine / peer: the engine run's tokens/s over the peer run's, both from the file's runs; "
               + ("the file's own value agrees (to its 3 decimals) for every target" if not differ else
                  f"the file's own value differs for: {', '.join(differ)}")
               + "; goals (the file's): >= 1.3x the best torch peer (pipelining, DTensor), >= 2x Megatron-core."]
    return t


def prose(files: list[GptFile], root: Path) -> list[Block]:
    out: list[Block] = [("h", "7.3 Two GPUs: pp=2 and tp=2 beside the peers")]
    for f in files:
        tol = (f.data.get("loss_tolerance") or {}).get("max_rel_diff")
        ratios = "; ".join(f"{r['key']} {times(r['value'])} (goal {r['target']}x, {_verdict(r['met'])})"
                           for r in ratio_rows(f))
        out.append(("b", f"{f.gpus} x {f.card} ({rel(f.path, root)}): {ratios or 'no target ratios in the file'}."))
        checks = {k: c for k, c in (f.data.get("loss_check") or {}).items()
                  if isinstance(c, dict) and finite(c.get("max_rel_diff"))}
        if checks:
            worst = max(checks, key=lambda k: checks[k]["max_rel_diff"])
            over = [k for k, c in checks.items() if finite(tol) and c["max_rel_diff"] > tol]
            out.append(("b", f"loss check: {len(checks)} runs against the 1-GPU engine run, the largest relative "
                             f"difference {checks[worst]['max_rel_diff']:.1e} ({worst}), tolerance {tol}: "
                             + (f"over it: {', '.join(over)}" if over else "every run within it") + "."))
    if not files:
        out.append(("b", f"not measured in this results set (no *-gpt-pp-tp.json); it is one 2-GPU call, `{RUN}`."))
    return out
