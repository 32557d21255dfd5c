"""Every file a run writes, checked on every rank before the first collective: missing directories are created,
and a path that could not be written, would block, or would land among the checkpoints is one line.

- `--save DIR` is the checkpoints' own: a metrics file or a trace inside it would be appended to a checkpoint's
  manifest, pruned with it, or overwritten by `latest`, so nothing else may be written under it.
- No output is an input of the run (--data, --config, --load), by any name, nor inside one (paths_apart.py);
  --save may hold the checkpoint --load names (a run continuing its own).
- An existing output that is a FIFO (opening it for writing waits for a reader that may never come), a socket,
  a block device or a directory is refused; a regular file is replaced or appended to, and a character device
  (/dev/null) is written to, with any write error naming the file (ReportingError).
"""
from __future__ import annotations

import importlib.util
import os
import stat

from .paths_apart import Output, clash
from .run import ConfigError, RunConfig


class ReportingError(ConfigError):
    """A report (metrics, trace) that cannot be written; the message names the file and the OS error."""


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


def _writable_dir(flag: str, directory: str) -> None:
    try:
        os.makedirs(directory or ".", exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot create the directory {directory} ({exc.strerror})") from None
    if not os.access(directory or ".", os.W_OK | os.X_OK):
        raise ConfigError(f"{flag}: the directory {os.path.abspath(directory or '.')} is not writable")


def _under(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _file_output(flag: str, value: str, path: str, save: str | None) -> None:
    """Output file `path` of `flag value`: not under --save, not something that blocks or is no file, its
    directory writable."""
    said = f"{flag} {value}" + ("" if path == value else f" ({path})")
    if save and _under(path, save):
        raise ConfigError(f"{said} is inside --save {save}: that directory holds the checkpoints alone (a file "
                          "there is mixed up with them, pruned or overwritten); write it elsewhere")
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None  # a directory on the way that is a file is named below
    except OSError as exc:
        raise ConfigError(f"{said} cannot be written ({exc.strerror})") from None
    if mode is not None:
        for test, kind in _KINDS:
            if test(mode):
                raise ConfigError(f"{said} is {kind}, not a file: give a file name")
    _writable_dir(f"{flag} {value}", os.path.dirname(path))


def _apart_from_inputs(cfg: RunConfig, config_file: str | None) -> None:
    r, c = cfg.reporting, cfg.checkpoint
    inputs = [(f"--data {cfg.data.path}", cfg.data.path), (f"--config {config_file}", config_file)]
    reports = [Output(f"--metrics {r.metrics}", r.metrics), Output(f"--tensorboard {r.tensorboard}", r.tensorboard)]
    reports += [Output(f"--trace {r.trace}" + ("" if s == ".json" else f" ({r.trace}{s})"), r.trace and r.trace + s)
                for s in (".json", ".png", ".simulated.png")]
    problem = clash([Output(f"--save {c.save}", c.save)], inputs) or clash(
        reports, inputs + [(f"--load {c.load}", c.load)])
    if problem:
        raise ConfigError(problem)


def check_output_paths(cfg: RunConfig, config_file: str | None = None) -> None:
    """Every file the run will write (rank 0 writes them; every rank checks, so every rank stops alike), checked
    against every file it reads (config_file: the --config TOML, when one was given)."""
    r, c = cfg.reporting, cfg.checkpoint
    _apart_from_inputs(cfg, config_file)
    if c.save:
        if os.path.exists(c.save) and not os.path.isdir(c.save):
            raise ConfigError(f"--save {c.save}: cannot create the directory (it is a file)")
        _writable_dir(f"--save {c.save}", c.save)
    if r.metrics:
        if os.path.isdir(r.metrics):
            raise ConfigError(f"--metrics {r.metrics} is a directory; give a file name")
        _file_output("--metrics", r.metrics, r.metrics, c.save)
    if r.trace:
        for suffix in (".json", ".png", ".simulated.png"):  # what write_trace writes
            _file_output("--trace", r.trace, r.trace + suffix, c.save)
    if r.tensorboard:
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(f"--tensorboard {r.tensorboard} needs the tensorboard package, which is not installed "
                              "(pip install tensorboard)")
        if c.save and _under(r.tensorboard, c.save):
            raise ConfigError(f"--tensorboard {r.tensorboard} is inside --save {c.save}: that directory holds the "
                              "checkpoints alone; write it elsewhere")
        if os.path.exists(r.tensorboard) and not os.path.isdir(r.tensorboard):
            raise ConfigError(f"--tensorboard {r.tensorboard} is a file; give a directory")
        _writable_dir(f"--tensorboard {r.tensorboard}", r.tensorboard)
