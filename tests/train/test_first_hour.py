"""A newcomer's first hour (README.md): defaults that learn, start-up lines that agree with each other, a summary
that fits a CPU run, a metrics file whose lines are steps, a failure line never glued to the live status line, and
`sample` naming an MLP checkpoint as the MLP. The two runs that prove the defaults learn start the driver; the
rest runs in this process."""
from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from checkpoint_fakes import OneRankEngine
from hybrid_engine import checkpoint
from hybrid_engine.config import ConfigError, PrecisionConfig, StageConfig
from hybrid_engine.metrics import records
from hybrid_engine.models import losses
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.workload import gpt_workload
from hybrid_engine.models.mlp.workload import mlp_workload
from hybrid_engine.parallel.pipeline.stages import plan_stages
from hybrid_engine.runtime import faults
from hybrid_engine.train import sample
from hybrid_engine.train.cli import parse_config
from hybrid_engine.train.progress import Progress, flops_text, summary_line

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ------------------------------------------------------------------------------------------ defaults that learn
def test_each_model_trains_with_its_own_optimizer_unless_told():
    assert parse_config([]).optimizer == parse_config(["--model", "mlp"]).optimizer
    assert (parse_config([]).optimizer.name, parse_config([]).optimizer.lr) == ("sgd", 10.0)
    gpt = parse_config(["--model", "gpt"]).optimizer
    assert (gpt.name, gpt.lr) == ("adamw", 3e-3)
    # another optimizer without --lr takes that optimizer's usual rate, not the model's own optimizer's
    assert parse_config(["--optimizer", "adamw"]).optimizer.lr == 1e-3
    assert parse_config(["--model", "gpt", "--optimizer", "sgd"]).optimizer.lr == 1e-2
    assert parse_config(["--model", "gpt", "--lr", "0.5"]).optimizer.lr == 0.5
    assert parse_config(["--lr", "0.01"]).optimizer.lr == 0.01


def _losses(tmp_path, *flags: str) -> list[float]:
    metrics = tmp_path / "m.jsonl"
    done = subprocess.run([sys.executable, "hybrid_engine.py", "--quiet", "--metrics", str(metrics), *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    return [r["loss"] for r in records.steps(records.read(metrics))]


def test_the_main_jobs_model_learns_with_the_defaults(tmp_path):
    """The MLP of the main job (dim 1024, depth 8) at its default optimizer: the loss falls within its 10 steps
    (at SGD 0.01 it wandered, 0.2989 -> 0.2943)."""
    losses_ = _losses(tmp_path)
    assert len(losses_) == 10 and losses_[-1] < 0.85 * losses_[0], losses_


def test_a_small_gpt_learns_with_the_defaults(tmp_path):
    """The GPT's default AdamW on the built-in corpus: 20 steps of a small GPT take the loss well below the
    uniform guess over 256 tokens (ln 256 = 5.55)."""
    losses_ = _losses(tmp_path, "--model", "gpt", "--layers", "2", "--hidden", "64", "--seq-len", "32", "--batch-size", "16",
                      "--micro-batches", "1", "--steps", "20")
    assert losses_[-1] < losses_[0] - 1.0, losses_


def test_abbreviated_flags_are_refused():
    with pytest.raises(ConfigError, match="unrecognized arguments: --step 2"):
        parse_config(["--step", "2"])


# --------------------------------------------------------------------------------------- start-up lines agree
def _module_counts(cut: str) -> list[int]:
    return [int(b) - int(a) + 1 for a, b in re.findall(r"modules (\d+)-(\d+)", cut)]


def test_the_cut_lines_and_the_program_lines_count_the_same_modules():
    mlp = mlp_workload(16, 4, 0)
    cut = mlp.describe_layout(2)
    assert cut.splitlines() == ["stage 0: modules 0-3, linear 0 .. relu 1 (cost 1.00x the mean stage)",
                                "stage 1: modules 4-7, linear 2 .. relu 3 (cost 1.00x the mean stage)"]
    native = plan_stages(mlp.model, mlp.layout(2), 1, PrecisionConfig(), StageConfig())
    # a native chain counts its Linear layers: 2 of each stage's 4 modules, each with its ReLU
    assert [p.describe(StageConfig()) for p in native] == [
        "stage 0: native Linear(+ReLU) chain, 2 Linear layers", "stage 1: native Linear(+ReLU) chain, 2 Linear layers"]
    autograd = plan_stages(mlp.model, mlp.layout(2), 1, PrecisionConfig(), StageConfig("autograd"))
    assert [int(re.search(r"autograd, (\d+) modules", p.describe(StageConfig("autograd"))).group(1))
            for p in autograd] == _module_counts(cut) == [4, 4]

    gpt = gpt_workload(GPTConfig(256, 3, 32, 2, 16))
    cut = gpt.describe_layout(2)
    first, last = cut.splitlines()  # 3 blocks, numbered from 0 as their modules are from the embedding's 0
    assert first.startswith("stage 0: modules 0-2, embedding .. block 1 (cost ")
    assert last.startswith("stage 1: modules 3-4, block 2 .. head (cost ")
    programs = plan_stages(gpt.model, gpt.layout(2), 1, PrecisionConfig(), StageConfig())
    assert [p.modules for p in programs] == _module_counts(cut) and sum(_module_counts(cut)) == len(gpt.model)


def test_the_built_in_mse_is_said_fused_only_with_a_native_last_stage():
    assert "gradient computed with the loss" in losses.describe(losses.MSE(), native_last_stage=True)
    line = losses.describe(losses.MSE(), native_last_stage=False)
    assert "fused" not in line and "autograd last stage" in line


def test_the_summary_of_a_cpu_run_says_rank_and_gflops():
    one = SimpleNamespace(world_size=1, dp_size=1, cp_size=1, pp_size=1, mp_size=1)
    assert summary_line(one, "1f1b", 8, [0.5], 1, [0.1]).startswith("summary: 1 rank (1 dp x 1 pp x 1 mp)")
    two = SimpleNamespace(world_size=2, dp_size=2, cp_size=1, pp_size=1, mp_size=1)
    assert summary_line(two, "1f1b", 8, [0.5], 1, [0.1]).startswith("summary: 2 ranks (")
    assert flops_text(0.00247, "cpu") == "2.47 model GFLOP/s per rank"
    assert flops_text(495.9, "cuda") == "496 model TFLOP/s per GPU"


# ------------------------------------------------------------------------------------------ what a run writes
@pytest.mark.parametrize("append", [False, True])
def test_the_trace_joins_the_last_steps_line_of_the_metrics_file(tmp_path, append):
    path = tmp_path / "m.jsonl"
    if append:  # a resumed run appends to the file it wrote before
        path.write_text(json.dumps({"step": 0, "loss": 3.0}) + "\n")
    progress = Progress(0, steps=3, batch_size=4, quiet=True, metrics=str(path), append=append)
    for step in (1, 2):
        progress.step({"step": step, "loss": 2.0 / step, "samples_per_s": 1.0, "step_time_s": 1.0})
    progress.record({"step": 2, "val_loss": 1.5})  # a validation: a line of its own, after its step's
    progress.record({"trace": {"measured_bubble": 0.25}})  # the trace of step 2: joins step 2's line
    progress.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in lines] == ([0] if append else []) + [1, 2, 2]
    assert lines[-2] == {"step": 2, "loss": 1.0, "samples_per_s": 1.0, "step_time_s": 1.0,
                         "trace": {"measured_bubble": 0.25}}
    assert lines[-1] == {"step": 2, "val_loss": 1.5}


def _screen(text: str) -> list[str]:
    """What a terminal shows for `text`: carriage return, erase to the end of the row, newline."""
    rows, col = [""], 0
    for token in re.findall(r"\r|\n|\x1b\[K|[^\r\n\x1b]+", text):
        if token == "\r":
            col = 0
        elif token == "\n":
            rows.append("")
            col = 0
        elif token == "\x1b[K":
            rows[-1] = rows[-1][:col]
        else:
            rows[-1] = rows[-1][:col] + token + rows[-1][col + len(token):]
            col += len(token)
    return rows


def test_a_line_said_on_a_terminal_is_never_glued_to_the_live_status_line():
    master, slave = pty.openpty()
    saved = os.dup(2)
    try:
        stream = os.fdopen(os.dup(slave), "w")
        progress = Progress(0, steps=100, batch_size=4, stream=stream)
        assert progress.live
        progress.step({"step": 0, "loss": 1.0, "samples_per_s": 5.0, "step_time_s": 0.2})
        os.write(slave, b"^C")  # the terminal's echo of Ctrl-C, at the end of the status line
        os.dup2(slave, 2)
        faults.say("hybrid_engine: rank 1: interrupted at step 1; last checkpoint none")
        faults.say("hybrid_engine: rank 0: interrupted at step 1; last checkpoint none")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    stream.close()
    os.close(slave)
    got = b""
    while not got.endswith(b"none\r\n"):
        got += os.read(master, 4096)
    os.close(master)
    assert _screen(got.decode().replace("\r\n", "\n")) == [
        "hybrid_engine: rank 1: interrupted at step 1; last checkpoint none",
        "hybrid_engine: rank 0: interrupted at step 1; last checkpoint none", ""]


def test_sample_names_an_mlp_checkpoint_as_the_mlp(tmp_path, capsys):
    mlp = mlp_workload(8, 1, 0)
    weights = {k: torch.zeros(v.shape) for k, v in mlp.model.state_dict().items()}
    path = checkpoint.save(OneRankEngine(weights), str(tmp_path), 1,
                           {"model": mlp.checkpoint_model, "optimizer": "sgd"})
    assert sample.main(["--load", path, "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: checkpoint {path} holds the MLP (--model mlp), not a GPT or a Llama: sample continues " \
                  "text with a checkpoint of --model gpt or --model llama\n"
