"""SLURM's compressed host lists, expanded without `scontrol` (a login node or a container may have none).

    expand("gpu[01-03,07],cpu5")      -> ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]
    expand("rack[1-2]-n[1,3]")        -> ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]

The syntax is `scontrol show hostnames`': names separated by commas outside brackets; a bracket holds numbers and
ranges separated by commas, a range's width (its leading zeros) kept; several brackets in one name multiply out,
the leftmost slowest.
"""
from __future__ import annotations

import itertools
import math
import re
import sys

_BRACKET = re.compile(r"\[([^\[\]]*)\]")
MAX_HOSTS = 2**16  # a host per rank at most (config/checks.py MAX_RANKS per axis): beyond it, not an allocation


class HostlistError(ValueError):
    """A host list this parser cannot read; the message names the list and what is wrong."""


def _split_top(text: str) -> list[str]:
    """`text` cut at the commas that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"host list {text!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"host list {text!r}: ']' without '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"host list {text!r}: '[' without ']'")
    parts.append(text[start:])
    return parts


def _items(spec: str, whole: str) -> list[tuple[str, str]]:
    """'01-03,07' -> [('01', '03'), ('07', '07')]: each number or range of a bracket, checked, none expanded."""
    out = []
    for item in spec.split(","):
        low, sep, high = item.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise HostlistError(f"host list {whole!r}: [{spec}] is not numbers and ranges (e.g. [01-03,07])")
        if sep and int(high) < int(low):
            raise HostlistError(f"host list {whole!r}: the range {item} runs backwards")
        out.append((low, high if sep else low))
    return out


def _numbers(items: list[tuple[str, str]]) -> list[str]:
    """[('01', '03'), ('07', '07')] -> ['01', '02', '03', '07']: a range keeps the width of its first bound."""
    return [str(n).zfill(len(low)) for low, high in items for n in range(int(low), int(high) + 1)]


def _names(hostlist: str) -> list[tuple[list[str], list[list[tuple[str, str]]]]]:
    """Each name of the list as (its literal parts, its brackets' items), the whole list checked."""
    names = []
    for name in _split_top(hostlist.strip()):
        if not name:
            raise HostlistError(f"host list {hostlist!r}: an empty name")
        literals = _BRACKET.split(name)[::2]  # text between brackets
        if any("[" in lit or "]" in lit for lit in literals):
            raise HostlistError(f"host list {hostlist!r}: unbalanced brackets in {name!r}")
        names.append((literals, [_items(spec, hostlist) for spec in _BRACKET.findall(name)]))
    return names


def count(hostlist: str) -> int:
    """How many hosts the list names, without naming them."""
    return sum(math.prod(sum(int(high) - int(low) + 1 for low, high in items) for items in brackets)
               for _, brackets in _names(hostlist))


def expand(hostlist: str) -> list[str]:
    """Every host name of a SLURM host list, in order; HostlistError for a list that is malformed, empty, or
    longer than MAX_HOSTS (counted before any is written out)."""
    total = count(hostlist)
    if total > MAX_HOSTS:
        raise HostlistError(f"host list {hostlist!r} names {total} hosts, more than {MAX_HOSTS}: not an allocation")
    hosts = []
    for literals, brackets in _names(hostlist):
        for picked in itertools.product(*map(_numbers, brackets)):
            hosts.append("".join(lit + num for lit, num in zip(literals, (*picked, ""))))
    return hosts


def first_host(hostlist: str) -> str:
    """The first host of a SLURM host list (where rank 0 runs, the rendezvous endpoint), the whole list checked
    but none expanded: each bracket's first number (a list of any length costs its text's length)."""
    literals, brackets = _names(hostlist)[0]
    return "".join(lit + num for lit, num in zip(literals, (*(items[0][0] for items in brackets), "")))


def main(argv: list[str] | None = None) -> int:
    """`python -m hybrid_engine.runtime.hostlist LIST`: LIST's first host (scripts/slurm/train.sbatch where scontrol
    is absent); a malformed list is one line and exit 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hybrid_engine.runtime.hostlist HOSTLIST", file=sys.stderr)
        return 2
    try:
        print(first_host(args[0]))
    except HostlistError as exc:
        print(f"hybrid_engine: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
