"""Reading the GPT's results files (section 7). Five kinds, each named `<date>-<gpus>x<card>-gpt[-kind].json`:

    -gpt.json           experiments/passes/gpt_bench.sh: one GPU, the engine's runs ("engine": {name: record}) and its
                        peers' ("peers": {system: record}), "ratios"
    -gpt-dp.json        experiments/passes/gpt_dp_pass.sh: "runs": {gpt_single, gpt_dp2[w][_zero]: record}, "ratios"
    -gpt-realtext.json  experiments/passes/gpt_realtext_pass.sh (experiments/analysis/realtext_results.py):
                        "runs": {bf16, fp32: curves and throughput}, "target"; bf16 with half weights (the engine's default)
    -gpt-realtext-autocast.json
                        the same pass with AMP_IMPL=autocast (bf16 run with --amp-impl autocast: fp32 weights cast
                        per matrix product); the same keys
    -gpt-pp-tp.json     experiments/passes/gpt_pp_tp_pass.sh (experiments/analysis/gpt_pp_tp_results.py), two
                        GPUs: "runs": {name: record}, "ratios" {name: {value, target, met, engine, peer}}, "loss_check", "loss_tolerance"

Where several files of one kind exist for one card, the newest (date in the name, then name) is used and the others
are listed as ignored, as report/data.py does for the bench files. Other names (e.g. a `-gpt-before-...` file kept
for the record) are not GPT files here and stay with report/data.py, which lists them as not bench files.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# The kind is matched whole (the name ends right after it): "-gpt-realtext-autocast" is not "-gpt-realtext", and an
# unknown tail ("-gpt-realtext-foo", "-gpt-before-fused-adamw") matches no kind and is left to report/data.py.
NAME = re.compile(r"^(?P<date>\d{4}-\d{2}-\d{2})-(?P<gpus>\d+)x(?P<card>[^-]+)-gpt"
                  r"(?:-(?P<kind>dp|realtext|realtext-autocast|pp-tp))?\.json$")
KINDS = {"": "engine", "dp": "runs", "realtext": "runs", "realtext-autocast": "runs",
         "pp-tp": "runs"}  # kind -> the key a file of that kind must hold
FIELDS = {"": "benches", "dp": "dp", "realtext": "realtext", "realtext-autocast": "realtext_autocast",
          "pp-tp": "pp_tp"}  # kind -> the GptResults list it fills


@dataclass
class GptFile:
    path: Path
    date: str
    card: str  # from the name: "H200"
    gpus: int
    data: dict


@dataclass
class GptResults:
    benches: list[GptFile] = field(default_factory=list)  # one GPU against the peers, newest per card
    dp: list[GptFile] = field(default_factory=list)  # data-parallel scaling, newest per card
    realtext: list[GptFile] = field(default_factory=list)  # bf16 vs fp32 on real text, newest per card
    realtext_autocast: list[GptFile] = field(default_factory=list)  # the same, bf16 by autocast, newest per card
    pp_tp: list[GptFile] = field(default_factory=list)  # pp=2 and tp=2 beside the peers, newest per card
    used: list[Path] = field(default_factory=list)
    ignored: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def claimed(self) -> set[Path]:
        """Every file this module read, used or not (report/data.py's verdict on them is replaced)."""
        return set(self.used) | {p for p, _ in self.ignored}


def load_gpt(root: Path) -> GptResults:
    out = GptResults()
    found: dict[str, list[GptFile]] = {kind: [] for kind in KINDS}
    for path in sorted(Path(root).glob("*-gpt*.json")):
        m = NAME.match(path.name)
        if not m:
            continue
        kind = m["kind"] or ""
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out.ignored.append((path, f"unreadable: {exc}"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get(KINDS[kind]), dict):
            out.ignored.append((path, f"a GPT file without its '{KINDS[kind]}' records"))
            continue
        found[kind].append(GptFile(path, m["date"], m["card"], int(m["gpus"]), data))
    for kind, files in found.items():
        newest: dict[str, GptFile] = {}
        for f in files:
            if f.card not in newest or (f.date, f.path.name) > (newest[f.card].date, newest[f.card].path.name):
                newest[f.card] = f
        kept = sorted(newest.values(), key=lambda f: f.card, reverse=True)  # H200 before H100
        setattr(out, FIELDS[kind], kept)
        out.used += [f.path for f in kept]
        kept_ids = {id(f) for f in kept}
        out.ignored += [(f.path, "an older GPT file of the same kind and card") for f in files if id(f) not in kept_ids]
    return out
