"""What in README.md and docs/ reads as a measurement: a number with a unit of time, rate, memory or a ratio (s,
min, ms, µs, tokens/s, samples/s, GiB, GB, MB, TFLOP/s, MFU, ×, %, a `k` for thousands), a number with thousands
separators, or a table cell that is a decimal number, in the pages' prose and tables. Code (fenced blocks and
`inline` spans) is left out, but for the comments of bash blocks: it is a command, a flag or a transcript of what a
command prints, held by the tests that run it. A number right after ≥, ≤ or `goal` is a target, not a measurement."""
from __future__ import annotations

import re

import os

from doc_sources import REPO, page

PAGES = ("README.md", "docs/api.md", "docs/architecture.md", "docs/checkpoints.md", "docs/cluster.md",
         "docs/failures.md", "docs/gpt.md", "docs/llama.md", "docs/long_sequences.md", "docs/performance.md", "docs/planning.md",
         "docs/kernels.md", "docs/schedules.md")
_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?"
_UNIT = r"(?:×|\s?%|\s?k\b|\s?(?:ms|µs|GiB|GB|MB|TFLOP/s)\b|\s(?:tokens|samples)/s|\s?MFU|\s(?:s|min)\b)"
MEASURED = re.compile(rf"(?<![\w.\-/]){_NUM}(?:\s?[–-]\s?{_NUM}{_UNIT}?)?{_UNIT}"
                      rf"|(?<![\w.\-/])\d+,\d{{3}}(?:,\d{{3}})*(?![\d,])"
                      rf"|(?<=\| )\**\d+\.\d+(?:–\d+\.\d+)?\**(?= \|)")
_CODE = re.compile(r"```.*?```|`[^`]*`")
_TARGET = re.compile(r"(?:≥|≤|\bgoal:?)\s*$")


def spans(text: str, pattern: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(re.escape(pattern), text)]


def _shell_comments(name: str) -> list[str]:
    """The comments of a page's bash blocks (whitespace-joined): what they say of a command (its time) is prose."""
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        blocks = re.findall(r"^```bash\n(.*?)^```", f.read(), re.M | re.S)
    comments = [line.strip() if line.strip().startswith("#") else line.partition("  #")[2]
                for block in blocks for line in block.splitlines()]
    return [" ".join(c.split()) for c in comments if c.strip()]


def measured_numbers(name: str) -> list[tuple[int, int, str]]:
    """(start, end, text) of each measured-looking number of a page (its whitespace-joined text), code left out but
    for its shell comments."""
    text = page(name)
    comments = [s for c in _shell_comments(name) for s in spans(text, c)]
    code = [(m.start(), m.end()) for m in _CODE.finditer(text)]
    out = []
    for m in MEASURED.finditer(text):
        in_code = any(a <= m.start() < b for a, b in code) and not any(a <= m.start() < b for a, b in comments)
        if in_code or _TARGET.search(text[max(0, m.start() - 8):m.start()]):
            continue
        out.append((m.start(), m.end(), m.group()))
    return out
