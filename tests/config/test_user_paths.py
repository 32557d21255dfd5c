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


# ------------------------------------------------------------------ an output is never an input of the run
def _refused(argv: list[str], config_file: str | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        check_output_paths(parse_config(argv), config_file)
    return str(err.value)


def test_an_output_that_is_an_input_is_refused_also_through_links(tmp_path):
    data, toml, ck = tmp_path / "t2.txt", tmp_path / "run.toml", tmp_path / "ck"
    data.write_text("the training text\n" * 10)
    toml.write_text("[training]\nsteps = 3\n")
    (ck / "step_000003").mkdir(parents=True)
    (ck / "step_000003" / "manifest.json").write_text("{}")
    os.symlink(data, tmp_path / "link.txt")
    os.link(toml, tmp_path / "hard.toml")
    assert _refused(["--data", str(data), "--metrics", str(data)]) == (
        f"--metrics {data} is --data {data}: writing it would destroy what is read (give another name)")
    assert _refused(["--data", str(data), "--metrics", str(tmp_path / "link.txt")]) == (
        f"--metrics {tmp_path / 'link.txt'} is --data {data} (the same file, through a link): writing it would "
        "destroy what is read (give another name)")
    assert _refused(["--config", str(toml), "--metrics", str(tmp_path / "hard.toml")], str(toml)).startswith(
        f"--metrics {tmp_path / 'hard.toml'} is --config {toml} (the same file, through a link)")
    manifest = ck / "step_000003" / "manifest.json"
    assert _refused(["--load", str(ck), "--metrics", str(manifest)]) == (
        f"--metrics {manifest} is inside --load {ck}: writing there would change what is read (give another path)")
    assert _refused(["--data", str(tmp_path / "t.json"), "--trace", str(tmp_path / "t")]).startswith(
        f"--trace {tmp_path / 't'} is --data {tmp_path / 't.json'}")
    assert _refused(["--load", str(ck), "--tensorboard", str(ck / "tb")]).startswith(
        f"--tensorboard {ck / 'tb'} is inside --load {ck}")
    assert _refused(["--data", str(data), "--save", str(tmp_path / "link.txt")]).startswith(
        f"--save {tmp_path / 'link.txt'} is --data {data} (the same file, through a link)")
    assert data.read_text() == "the training text\n" * 10 and toml.read_text() == "[training]\nsteps = 3\n"
    # a run continuing its own checkpoints, and outputs beside the inputs, are fine
    check_output_paths(parse_config(["--load", str(ck), "--save", str(ck), "--data", str(data), "--metrics",
                                     str(tmp_path / "m.jsonl"), "--trace", str(tmp_path / "t")]), str(toml))


def test_the_driver_names_its_config_file_to_the_rule():
    from hybrid_engine.config.flags import config_file

    assert config_file(["--steps", "3", "--config", "a.toml", "--metrics", "m"]) == "a.toml"
    assert config_file(["--config=b.toml"]) == "b.toml" and config_file(["--steps", "3"]) is None


def test_data_prepare_never_writes_into_the_tokenizer_it_reads(tmp_path, capsys):
    import hybrid_engine.data as data

    book, hf = tmp_path / "book.txt", tmp_path / "hf"
    book.write_text("words words\n" * 20)
    hf.mkdir()
    (hf / "tokenizer.json").write_text("{}")
    for out in (hf / "tokenizer.json", hf / "book.tok"):
        assert data.main(["prepare", str(book), str(out), "--tokenizer", str(hf), "--force"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"error: output {out} is inside --tokenizer {hf}" in err, err
    assert (hf / "tokenizer.json").read_text() == "{}" and not (hf / "book.tok").exists()


def test_the_driver_refuses_a_metrics_file_that_is_its_config_before_writing(tmp_path):
    import subprocess
    import sys

    toml = tmp_path / "run.toml"
    toml.write_text("[training]\nsteps = 1\n")
    done = subprocess.run([sys.executable, "-m", "hybrid_engine", "--config", str(toml), "--metrics", str(toml)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr == (f"hybrid_engine: error: --metrics {toml} is --config {toml}: writing it would destroy what "
                           "is read (give another name)\n")
    assert toml.read_text() == "[training]\nsteps = 1\n"
