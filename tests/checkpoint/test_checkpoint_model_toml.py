"""A --save directory records its model (DIR/model.toml: name, seed, every option), and a run that starts from
one of its checkpoints reads it under its --config and flags: continuing a GPT needs no shape flags again. A run
that starts from a checkpoint of another run says "started from", one that continues its own --save "resumed"."""
import os
import subprocess
import sys

import pytest

from hybrid_engine.config.engine import ConfigError
from hybrid_engine.train.cli import parse_config
from launch_utils import DRIVER, REPO

ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
GPT = ("--model", "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--seed", "3")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), "--batch-size", "4", "--micro-batches", "1", *args],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)


def _model_line(run: subprocess.CompletedProcess) -> str:
    return next(line for line in run.stdout.splitlines() if line.startswith("model: "))


def test_a_gpt_continues_from_its_save_directory_without_its_shape_flags(tmp_path):
    first = _run(*GPT, "--steps", "2", "--save", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    with open(tmp_path / "a" / "model.toml") as f:
        table = f.read()
    for line in ('name = "gpt"', "seed = 3", "layers = 2", "hidden = 32", "heads = 2", "seq_len = 16"):
        assert f"\n{line}\n" in table, table
    # another directory starts from it: the model is the checkpoint's, the words say it started there
    second = _run("--steps", "3", "--load", str(tmp_path / "a"), "--save", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    assert _model_line(second) == _model_line(first)
    assert f"started from {tmp_path / 'a' / 'step_000002'} at its step 2" in second.stdout
    assert "resumed" not in second.stdout
    # a flag still overrides the table (here: a shape the checkpoint does not hold, refused by the loader)
    third = _run("--steps", "3", "--load", str(tmp_path / "a" / "step_000002"), "--hidden", "64")
    assert third.returncode == 2 and "64" in third.stderr
    # continuing its own directory: resumed
    fourth = _run("--steps", "4", "--save", str(tmp_path / "b"), "--resume")
    assert fourth.returncode == 0, fourth.stderr
    assert f"resumed from {tmp_path / 'b' / 'step_000003'} at step 3" in fourth.stdout
    assert _model_line(fourth) == _model_line(first)


def test_the_mlp_records_its_shape_too(tmp_path):
    first = _run("--dim", "16", "--depth", "3", "--steps", "1", "--save", str(tmp_path / "a"), "--quiet")
    assert first.returncode == 0, first.stderr
    again = _run("--model", "mlp", "--steps", "2", "--load", str(tmp_path / "a"))
    assert again.returncode == 0, again.stderr
    assert "3 x Linear(16, 16)" in again.stdout


def test_a_damaged_model_table_is_one_line_naming_it(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model.toml").write_text("[model\n")
    with pytest.raises(ConfigError) as info:
        parse_config(["--load", str(tmp_path / "a" / "step_000002")])
    assert str(info.value).startswith(f"{tmp_path / 'a' / 'model.toml'} (the model table of the checkpoint the run "
                                      "starts from) is not valid TOML"), info.value
    # a table naming another model than the flags' is left alone
    (tmp_path / "a" / "model.toml").write_text('[model]\nname = "gpt"\nhidden = 32\n')
    cfg = parse_config(["--load", str(tmp_path / "a"), "--model", "mlp"])
    assert cfg.model.name == "mlp"
    assert parse_config(["--load", str(tmp_path / "a")]).model.hidden == 32
