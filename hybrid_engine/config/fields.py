"""A configuration dataclass's fields as the user sees them, so that each is written once.

The string literal under a field is its documentation: the flag's help and what its TOML key means. A field's
metadata (`flag(...)`) names its command-line flag where that differs from the field's own name, and its choices
and metavar. The command line (flags.py) and the TOML tables (run.py) are both made from these.

    @dataclass(frozen=True)
    class ScheduleConfig:
        name: str = field(default="1f1b", metadata=flag("--schedule", choices=SCHEDULES))
        \"\"\"naive | gpipe | 1f1b | interleaved | zb1 (...).\"\"\"
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
from typing import Any, Optional, Sequence


def flag(name: Optional[str] = None, *, choices: Optional[Sequence] = None, metavar: Optional[str] = None,
         const=None, aliases: Optional[dict] = None, bools: Optional[dict] = None,
         words: Optional[dict] = None) -> dict:
    """A field's metadata for its flag: its name (default: --field-name), its choices and its metavar; const: the
    value of the flag given alone (a choice field whose flag may come without one); aliases: other flags that
    set one value each ({"--no-recompute": "none"}); bools: the value a TOML true or false stands for; words: what
    a word stands for in a field of another type, on the command line and in TOML ({"auto": None})."""
    out: dict[str, Any] = {}
    if words:
        out["words"] = dict(words)
    if const is not None:
        out["const"] = const
    if aliases:
        out["aliases"] = dict(aliases)
    if bools:
        out["bools"] = dict(bools)
    if name is not None:
        out["flag"] = name
    if choices is not None:
        out["choices"] = tuple(choices)
    if metavar is not None:
        out["metavar"] = metavar
    return out


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: its documentation, one paragraph} of a dataclass, read from the string literal under each field; an
    inherited field's from the base class that declares it."""
    docs = {}
    for base in reversed(cls.__mro__[1:]):
        if dataclasses.is_dataclass(base):
            docs.update(field_docs(base))
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    for here, after in zip(body, body[1:]):
        if (isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[here.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def class_doc(cls: type) -> str:
    """The first sentence of a dataclass's own docstring."""
    doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split())
    first = re.split(r"(?<=\.) ", doc, maxsplit=1)[0].rstrip(".")
    return re.sub(r" \([^()]*(?:/|\.py)[^()]*\)", "", first)  # where it lives in the code is not the user's concern


def flag_name(field: dataclasses.Field) -> str:
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


def value_type(field: dataclasses.Field) -> type:
    """int, float, str or bool: the field's type, an optional one's inner type ("int | None" -> int)."""
    names = {"int": int, "float": float, "str": str, "bool": bool}
    annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", str(field.type))
    parts = [p.strip() for p in annotation.split("|") if p.strip() != "None"]
    if len(parts) != 1 or parts[0] not in names:
        raise TypeError(f"configuration field {field.name}: type {annotation} has no flag (int, float, str or bool, "
                        "optionally | None)")
    return names[parts[0]]


def default_text(value, words: Optional[dict] = None) -> str:
    for word, meaning in (words or {}).items():
        if value is meaning or (value == meaning and type(value) is type(meaning)):
            return word
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)
