"""What a resumed run may continue from, in this process: --resume on another --seed or on other data is refused,
--load from it says so; a stopped rank names the checkpoint `latest` really names."""
from __future__ import annotations

import dataclasses
import os

import pytest

from checkpoint_fakes import SMALL_GPT, OneRankEngine, write_gpt_checkpoint
from hybrid_engine import checkpoint
from hybrid_engine.checkpoint import CheckpointError
from hybrid_engine.train.cli import parse_config
from hybrid_engine.models import large_linear_model
from hybrid_engine.checkpoint.runs import checkpoint_to_start_from
from hybrid_engine.train.trainer import RunState
from hybrid_engine.models.gpt.workload import gpt_workload
from hybrid_engine.models.mlp.workload import mlp_workload

MLP = ["--dim", "16", "--depth", "2", "--optimizer", "sgd"]


def _start(cfg, workload):
    """checkpoint_to_start_from as the driver calls it (its --save directory exists), then the directory freed."""
    if cfg.checkpoint.save:
        os.makedirs(cfg.checkpoint.save, exist_ok=True)
    try:
        return checkpoint_to_start_from(cfg, workload)
    finally:
        for hold in list(checkpoint.lock._HOLDS):  # the --save directory this process took
            hold.release()


@pytest.fixture
def mlp_run(tmp_path):
    """A --save directory whose latest is an MLP checkpoint of seed 0 (what one run of the driver leaves)."""
    save = tmp_path / "ckpt"
    weights = {k: v.detach().clone() for k, v in large_linear_model(16, 2, 0, "cpu").state_dict().items()}
    run_info = {"model": mlp_workload(16, 2, 0).checkpoint_model, "optimizer": "sgd"}
    checkpoint.save(OneRankEngine(weights), str(save), 2, run_info)
    return save


def test_resume_with_another_seed_is_refused(mlp_run):
    cfg = parse_config([*MLP, "--seed", "1", "--save", str(mlp_run), "--resume"])
    with pytest.raises(CheckpointError) as err:
        _start(cfg, mlp_workload(16, 2, 1))
    assert str(err.value) == (
        f"checkpoint {mlp_run / 'step_000002'} was trained with --seed 0; this run has --seed 1 (other batches, the "
        "MLP's regression target): --resume continues a run on the data it was trained on (pass --seed 0), or start "
        "a new --save directory from it with --load")
    cfg = parse_config([*MLP, "--seed", "0", "--save", str(mlp_run), "--resume"])
    assert _start(cfg, mlp_workload(16, 2, 0)).notes == []


def test_load_with_another_seed_says_so_in_one_line(mlp_run, tmp_path):
    cfg = parse_config([*MLP, "--seed", "1", "--load", str(mlp_run), "--save", str(tmp_path / "new")])
    ckpt = _start(cfg, mlp_workload(16, 2, 1))
    assert ckpt.notes == [f"note: checkpoint {mlp_run / 'step_000002'} was trained with --seed 0; this run has "
                          "--seed 1 (other batches, the MLP's regression target): training goes on from its weights "
                          "on this run's data"]


def test_resume_on_other_data_of_the_same_vocabulary_is_refused(tmp_path):
    texts = {}
    for name, line in (("a.txt", "the first book, in bytes\n"), ("b.txt", "another book entirely, also bytes\n")):
        (tmp_path / name).write_text(line * 400)
        texts[name] = str(tmp_path / name)
    shape = ["--model", "gpt", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq-len", "16",
             "--optimizer", "sgd"]
    trained = gpt_workload(SMALL_GPT, texts["a.txt"])
    write_gpt_checkpoint(tmp_path / "ckpt", run_info={"data": trained.checkpoint_data})
    cfg = parse_config([*shape, "--data", texts["b.txt"], "--save", str(tmp_path / "ckpt"), "--resume"])
    with pytest.raises(CheckpointError) as err:
        _start(cfg, gpt_workload(SMALL_GPT, texts["b.txt"]))
    assert str(err.value).startswith(f"checkpoint {tmp_path / 'ckpt' / 'step_000001'} was trained on "
                                     f"{texts['a.txt']} (10000 tokens); this run's data {texts['b.txt']} (13600 "
                                     "tokens) is other data: --resume continues a run on the data it was trained "
                                     "on (pass the same --data)"), str(err.value)
    cfg = parse_config([*shape, "--data", texts["a.txt"], "--save", str(tmp_path / "ckpt"), "--resume"])
    assert _start(cfg, gpt_workload(dataclasses.replace(SMALL_GPT), texts["a.txt"])).notes == []


def test_a_stopped_rank_names_the_checkpoint_latest_names(tmp_path):
    # rank 0 had published step_000511 while this rank was still waiting to hear of it
    (tmp_path / "latest").write_text("step_000511\n")
    state = RunState(512, str(tmp_path / "step_000510"), save=str(tmp_path))
    assert state.describe() == f"at step 512; last checkpoint {tmp_path / 'step_000511'}"
    (tmp_path / "latest").unlink()  # no pointer yet: what this rank knows
    assert state.describe() == f"at step 512; last checkpoint {tmp_path / 'step_000510'}"
