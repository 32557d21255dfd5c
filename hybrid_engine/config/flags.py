"""The command line's flags and --config files, mapped onto RunConfig (hybrid_engine/config/run.py).

The flags are made from the dataclasses (fields.py): one group per table of RunConfig, one flag per field, its help
the field's documentation and its real default, its name the field's (or its metadata's). Flags not given stay out
of the parsed namespace (argparse.SUPPRESS), so a --config file's values stand unless a flag overrides them.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Callable, Mapping

from .engine import ConfigError
from .checkpoint_model import model_toml_to_read
from .fields import class_doc, default_text, field_docs, flag_name, value_type
from .run import RunConfig
from .input_files import read_regular_file

EPILOG = """\
examples:
  one process on the CPU:
    python hybrid_engine.py --dim 256 --depth 4 --steps 20
  8 ranks on one node (CPU + gloo without GPUs; with 8 GPUs, one GPU per rank, CUDA + NCCL):
    torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2
  8 GPUs, fp16, zero-bubble schedule, checkpoints every 100 steps (restartable):
    torchrun --nproc_per_node=8 --max-restarts 3 hybrid_engine.py --dp 2 --pp 2 --mp 2 --amp fp16 \\
        --schedule zb1 --merge-wgrad --steps 1000 --save runs/ckpt --save-every 100 --resume
  a run described in a file (one table per part: [parallel], [model], [data], [optimizer], [training],
  [checkpoint], [reporting], [schedule], [stages], [precision], [data_parallel]); flags override it:
    torchrun --nproc_per_node=8 hybrid_engine.py --config run.toml --steps 100
  (python -m hybrid_engine and the hybrid-engine command take the same flags)
  torchrun's arguments and agent without its warnings and tracebacks, exiting with the ranks' own code:
    python -m hybrid_engine.launch --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2

environment:
  HYBRID_ENGINE_DEBUG=1                  a failure raises with its full traceback instead of one line
  HYBRID_ENGINE_TEST_KILL_AT_STEP=S      test hooks (first attempt only, see hybrid_engine/runtime/fault_plan.py):
  HYBRID_ENGINE_TEST_KILL_RANK=R           rank R (default 0) SIGKILLs itself as step S begins,
  HYBRID_ENGINE_TEST_CRASH_IN_SAVE=S       or dies writing its shard of checkpoint S;
  HYBRID_ENGINE_TEST_NAN_AT_STEP=S         NaN inputs at step S,
  HYBRID_ENGINE_TEST_FREEZE_AT_STEP=S      or rank R stops itself (SIGSTOP) as step S begins
  HYBRID_ENGINE_HOST=NAME                the host name the node map uses (default: the machine's)
  SLURM_PROCID, SLURM_NTASKS, ...        a task of a bare srun step is a rank (see docs/cluster.md)

exit codes: 0 done; 2 bad input (flags, grid, checkpoint); 1 training stopped (NaN loss) or a failure (a lost
peer: the line names it); 130 Ctrl-C (SIGINT); 143 SIGTERM. Under torchrun the shell sees torchrun's own code
(1 when any rank failed, whatever the rank's code); its report names the first rank that failed and its code.
python -m hybrid_engine.launch exits with that rank's code.
"""

_DEFAULTS = RunConfig()


class _Help(argparse.RawDescriptionHelpFormatter):
    """--help at up to 110 columns: the fields' documentation reads as sentences, not a narrow column."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32, width=110)

    def _split_lines(self, text: str, width: int) -> list[str]:  # "(default X)" is never cut in two
        return [line.replace("\0", " ") for line in super()._split_lines(text.replace("(default ", "(default\0"),
                                                                           width)]


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (printed once) and exit code 2."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(message)


def _add_field(group, table: str, f: dataclasses.Field, doc: str, default, choices=None) -> None:
    """One flag, made from the field: its name, type, choices and metavar from the field (choices: given by the
    caller where a registry holds them), its help from the field's documentation with its real default said
    once. The dest is `table.field`."""
    kind = value_type(f)
    words = f.metadata.get("words", {})
    help_text = f"{doc} (default {default_text(default, words)})".replace("%", "%%")
    names = [flag_name(f)]
    if kind is bool:
        group.add_argument(*names, dest=f"{table}.{f.name}", action=argparse.BooleanOptionalAction, help=help_text)
        return
    choices = tuple(choices) if choices is not None else f.metadata.get("choices")
    alone = {"nargs": "?", "const": f.metadata["const"]} if "const" in f.metadata else {}
    if words:
        kind = _with_words(kind, words)
    metavar = f.metadata.get("metavar", f.name.upper())
    if words and not choices:
        metavar = "|".join((*words, metavar))
    group.add_argument(*names, dest=f"{table}.{f.name}", type=kind, choices=choices, help=help_text,
                       metavar=None if choices else metavar, **alone)
    for alias, value in f.metadata.get("aliases", {}).items():
        group.add_argument(alias, dest=f"{table}.{f.name}", action="store_const", const=value,
                           help=f"the same as {names[0]} {value} (default {default_text(default)})")


def _with_words(kind: type, words: dict):
    """kind's parser that also takes the field's words (--micro-batches auto)."""
    def parse(text: str):
        return words[text] if text in words else kind(text)

    parse.__name__ = kind.__name__  # argparse names the type in its "invalid int value" line
    return parse


def build_parser(models: Mapping[str, type], prog: str | None = None,
                 keep: Callable[[str, str], bool] | None = None) -> argparse.ArgumentParser:
    """Every field of every table of RunConfig as a flag, one group per table (the --config file's tables), each
    flag's help its field's documentation; [model] also gets a group per model of the registry (models: each
    model's options class by name) with its own options. Flags not given stay out of the namespace
    (argparse.SUPPRESS), so a --config file's values stand unless overridden. keep(table, field): whether that
    field is a flag of this command (None: every field; the plan command keeps those that planning reads)."""
    p = _OneLineParser(
        prog=prog, argument_default=argparse.SUPPRESS, epilog=EPILOG, allow_abbrev=False,
        formatter_class=_Help,
        description="Data x pipeline x tensor parallel training with a C++ core, of a model of the registry (--model):\n"
        + "".join(f"  {name}: {class_doc(options)}\n" for name, options in models.items())
        + "One group of flags per table of a --config TOML file; flags override the file's values.")
    p.add_argument("--config", metavar="TOML", help="read the run from this TOML file; flags override it")
    for table in dataclasses.fields(RunConfig):
        part = getattr(_DEFAULTS, table.name)
        group = p.add_argument_group(f"[{table.name}] {class_doc(type(part))}")
        docs = field_docs(type(part))
        for f in dataclasses.fields(part):
            if f.metadata.get("model_options") or (keep is not None and not keep(table.name, f.name)):
                continue
            _add_field(group, table.name, f, docs[f.name], getattr(part, f.name), models if f.name == "name"
                       and table.name == "model" else None)
        if table.name == "model":
            _add_model_options(p, models)
    return p


def _add_model_options(p: argparse.ArgumentParser, models: Mapping[str, type]) -> None:
    """One group per model: its options' flags (dest model.<option>); an option two models share is one flag."""
    seen: set[str] = set()
    for name, options in models.items():
        group = p.add_argument_group(f"[model] --model {name}: {class_doc(options)}")
        defaults, docs = options(), field_docs(options)
        for f in dataclasses.fields(options):
            if f.name not in seen:
                seen.add(f.name)
                _add_field(group, "model", f, docs[f.name], getattr(defaults, f.name))


MAX_CONFIG_BYTES = 16 << 20


def read_toml(path: str, said: str | None = None) -> dict:
    """A --config file as {table: {key: value}}; a missing, unreadable or malformed file is one ConfigError. Only
    a regular file is read (never waiting on a FIFO), up to 16 MiB, as UTF-8. said: how the line names the file
    (default `--config PATH`)."""
    said = said or f"--config {path}"
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    raw = read_regular_file(path, MAX_CONFIG_BYTES, said)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{said} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                          "a TOML file is text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{said} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{said} nests arrays or tables too deeply to read: not a run description") from None


def config_file(argv: list[str]) -> str | None:
    """The --config TOML these flags name (None: none), as parse_config reads it: what a run reads besides its
    data and checkpoints, which its outputs must not overwrite."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--config", default=None)
    return p.parse_known_args(argv)[0].config


def parse_config(argv: list[str] | None, models: Mapping[str, type], prog: str | None = None) -> RunConfig:
    """Flags over the --config file over the dataclasses' defaults. models: each model's options class by name
    (models/registry.py options())."""
    return config_of(vars(build_parser(models, prog).parse_args(argv)), models)


def config_of(given: dict, models: Mapping[str, type]) -> RunConfig:
    """The RunConfig of a parsed namespace of build_parser's ({'table.field': value, 'config': path}): the flags
    given over the --config file over the defaults."""
    given = dict(given)
    path = given.pop("config", None)
    tables = read_toml(path) if path else {}
    for dest, value in given.items():
        table, name = dest.split(".")
        section = tables.setdefault(table, {})
        if isinstance(section, dict):
            section[name] = value
    _under_the_checkpoints_model(tables)
    return RunConfig.from_tables(tables, models, source=f"--config {path}" if path else "flags")


def checkpoint_model_toml(tables: dict) -> str | None:
    """The model.toml (config/checkpoint_model.py) of the checkpoint these tables start from, if any."""
    ckpt = tables.get("checkpoint") if isinstance(tables.get("checkpoint"), dict) else {}
    load, save, resume = ckpt.get("load"), ckpt.get("save"), ckpt.get("resume", False)
    if not all(isinstance(v, (str, type(None))) for v in (load, save)):
        return None  # RunConfig.from_tables names the wrong type
    return model_toml_to_read(load, save, resume is True)


def _under_the_checkpoints_model(tables: dict) -> None:
    """The [model] keys neither the --config file nor a flag gives come from the checkpoint's model.toml, when
    it describes the same model (or no --model is given)."""
    toml = checkpoint_model_toml(tables)
    model = tables.setdefault("model", {})
    if toml is None or not isinstance(model, dict):
        return
    theirs = read_toml(toml, f"{toml} (the model table of the checkpoint the run starts from)").get("model")
    if isinstance(theirs, dict) and model.get("name", theirs.get("name")) == theirs.get("name"):
        for key, value in theirs.items():
            model.setdefault(key, value)
