"""A resumed run with other optimizer settings than its checkpoint's says which, once (as for the lr schedule);
lr-schedule flags that a constant lr never reaches are refused, never ignored."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybrid_engine.config.run import ConfigError
from hybrid_engine.models import registry
from hybrid_engine.train.cli import parse_config
from launch_utils import DRIVER, REPO

GPT = ("--model", "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16", "--batch-size", "4",
       "--micro-batches", "1", "--quiet")


def _driver(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, str(DRIVER), *GPT, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_resume_with_other_betas_weight_decay_and_clipping_says_so_once(tmp_path):
    save = str(tmp_path / "ckpt")
    first = _driver("--steps", "1", "--save", save)
    assert first.returncode == 0, first.stderr
    manifest = json.load(open(os.path.join(save, "step_000001", "manifest.json")))
    assert manifest["optimizer_settings"] == {"clip_grad": 1.0, "betas": "0.9,0.999", "weight_decay": 0.01}

    same = _driver("--steps", "2", "--save", save, "--resume")
    assert same.returncode == 0, same.stderr
    assert "differ" not in same.stdout

    other = _driver("--steps", "3", "--save", save, "--resume", "--betas", "0.9,0.95", "--weight-decay", "0.1",
                    "--clip-grad", "0.5")
    assert other.returncode == 0, other.stderr
    notes = [ln for ln in other.stdout.splitlines() if "optimizer settings" in ln]
    assert notes == [f"note: the optimizer settings differ from those {os.path.join(save, 'step_000002')} was "
                     "trained on (clip_grad 1.0 -> 0.5, betas 0.9,0.999 -> 0.9,0.95, weight_decay 0.01 -> 0.1): from "
                     "step 2 the update follows this run's"]


@pytest.mark.parametrize("flags, message", [
    (("--min-lr", "1e-4"), "--min-lr applies to --lr-decay cosine or linear only (got constant: the lr stays at "
                           "--lr); add --lr-decay cosine or linear, or leave it out"),
    (("--lr-decay-steps", "50"), "--lr-decay-steps applies to --lr-decay cosine or linear only (got constant: the "
                                 "lr stays at --lr); add --lr-decay cosine or linear, or leave it out"),
    (("--min-lr", "1e-4", "--lr-decay-steps", "50"), "--min-lr and --lr-decay-steps apply to --lr-decay cosine or "
                                                     "linear only"),
])
def test_decay_flags_with_a_constant_lr_are_refused(flags, message):
    with pytest.raises(ConfigError) as err:
        parse_config(list(flags)).validate(1, "cpu", registry.check_model)
    assert str(err.value).startswith(message)
    parse_config([*flags, "--lr-decay", "cosine"]).validate(1, "cpu", registry.check_model)
