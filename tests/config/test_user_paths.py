"""Paths a user hands the driver, in this process: an output under --save is refused, a FIFO is refused instead
of blocking forever, and a --config that is not UTF-8 or nests too deeply is one line naming the file, before
anything is set up."""
from __future__ import annotations

import os
import threading

import pytest

from hybrid_engine.config import ConfigError
from hybrid_engine.train.cli import parse_config
from hybrid_engine.config.output_paths import check_output_paths


def _within(seconds: float, fn, unblock: str | None = None):
    """fn()'s ConfigError (or None) from a thread; a call still blocked after `seconds` fails the test (and
    `unblock`, a FIFO, is opened for writing so that the blocked reader returns)."""
    outcome: list = []

    def call() -> None:
        try:
            fn()
            outcome.append(None)
        except ConfigError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if unblock:
            os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("blocked")
    return outcome[0]


# ------------------------------------------------------------------------------- 3. outputs inside --save
@pytest.mark.parametrize("flag, name", [("--metrics", "m.jsonl"), ("--trace", "t"), ("--metrics", "step_000002/m")])
def test_an_output_inside_the_save_directory_is_refused(tmp_path, flag, name):
    save = tmp_path / "ckpt"
    with pytest.raises(ConfigError) as err:
        check_output_paths(parse_config(["--save", str(save), flag, str(save / name)]))
    assert f"{flag} {save / name}" in str(err.value) and f"is inside --save {save}: that directory holds the " \
        "checkpoints alone" in str(err.value), str(err.value)
    os.symlink(save, tmp_path / "link")  # also through a link to it
    with pytest.raises(ConfigError, match="is inside --save"):
        check_output_paths(parse_config(["--save", str(save), flag, str(tmp_path / "link" / name)]))
    check_output_paths(parse_config(["--save", str(save), flag, str(tmp_path / "ckpt-metrics" / name)]))  # beside: fine


# --------------------------------------------------------------------------------- 7. FIFOs never block
def test_a_metrics_path_that_is_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    error = _within(10, lambda: check_output_paths(parse_config(["--metrics", str(fifo)])))
    assert str(error) == f"--metrics {fifo} is a FIFO, not a file: give a file name"


def test_a_config_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    error = _within(10, lambda: parse_config(["--config", str(fifo)]), unblock=str(fifo))
    assert str(error) == f"--config {fifo} is a FIFO, not a regular file"


# ----------------------------------------------------------------------------- 9. a --config that is no TOML
def test_a_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_bytes(b"[model]\ndim = 64\nname = \"\xff\xfe\"\n")
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(path)])
    assert str(err.value) == f"--config {path} is not UTF-8 text (byte 0xff at offset 25): a TOML file is text"


def test_a_config_nested_100000_deep_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(path)])
    assert str(err.value) == f"--config {path} nests arrays or tables too deeply to read: not a run description"


def test_a_rank_that_fails_before_the_rendezvous_does_not_take_the_launcher_for_gone(monkeypatch):
    # under torchrun a rank that fails on a bad --config has not asked the store anything yet: its silence says
    # nothing about the launcher
    from hybrid_engine.runtime import faults

    for name, value in (("TORCHELASTIC_RUN_ID", "test"), ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    heartbeat = faults.Heartbeat(0, 2)
    assert heartbeat.launcher_gone() is None and heartbeat.describe_loss() is None
