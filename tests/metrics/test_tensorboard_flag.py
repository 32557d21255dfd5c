"""--tensorboard DIR in one process: which record fields become which scalars, and the flag refused in one line
(before any collective) when the tensorboard package is missing or DIR cannot hold it. The event file itself is
read back in tests/test_cluster_launch.py."""
import dataclasses
import importlib.util

import pytest

from hybrid_engine.config import ConfigError, RunConfig
from hybrid_engine.config.output_paths import check_output_paths
from hybrid_engine.metrics.tensorboard import TensorBoardWriter, scalars


def test_a_record_becomes_its_scalars():
    record = {"step": 3, "loss": 0.5, "step_time_s": 0.02, "samples_per_s": 800.0, "tokens_per_s": 800.0,
              "peak_mem_gib": [0.3, 0.5], "loss_scale": 65536.0, "skipped": False, "grad_norm": None, "lr": 1e-3,
              "mfu": None}
    assert scalars(record) == {"train/loss": 0.5, "time/step_s": 0.02, "throughput/samples_per_s": 800.0,
                               "throughput/tokens_per_s": 800.0, "memory/peak_gib": 0.5,
                               "precision/loss_scale": 65536.0, "train/lr": 1e-3}
    assert scalars({"step": 9, "val_loss": 2.5, "entropy_floor": None}) == {"val/loss": 2.5}


def test_the_writer_writes_an_event_file(tmp_path):
    writer = TensorBoardWriter(str(tmp_path))
    writer.write({"step": 0, "loss": 1.0})
    writer.write({"trace": {}})  # not a step: nothing
    writer.close()
    assert [p.name.startswith("events.out.tfevents.") for p in tmp_path.iterdir()] == [True]


def _with(**reporting) -> RunConfig:
    cfg = RunConfig()
    return dataclasses.replace(cfg, reporting=dataclasses.replace(cfg.reporting, **reporting))


def test_a_missing_tensorboard_package_is_one_line(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError) as err:
        check_output_paths(_with(tensorboard=str(tmp_path / "tb")))
    assert str(err.value) == (f"--tensorboard {tmp_path / 'tb'} needs the tensorboard package, which is not "
                              "installed (pip install tensorboard)")


def test_a_tensorboard_dir_that_is_a_file_or_among_the_checkpoints_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file; give a directory"):
        check_output_paths(_with(tensorboard=str(tmp_path / "f")))
    cfg = dataclasses.replace(_with(tensorboard=str(tmp_path / "ckpt" / "tb")),
                              checkpoint=dataclasses.replace(RunConfig().checkpoint, save=str(tmp_path / "ckpt")))
    with pytest.raises(ConfigError, match="is inside --save"):
        check_output_paths(cfg)
