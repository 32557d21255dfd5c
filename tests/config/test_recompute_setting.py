"""Recomputation is one setting, [stages] recompute = none | selective | full, whichever way a user says it: the
flag with or without a mode, the flags a run used before (--no-recompute, --selective-recompute), TOML true/false,
and the Engine's StageConfig(impl, True)."""
from __future__ import annotations

import pytest

from hybrid_engine.config import ConfigError, StageConfig
from hybrid_engine.models import registry
from hybrid_engine.train.cli import parse_config


@pytest.mark.parametrize("flags,mode", [([], "none"), (["--recompute"], "full"), (["--recompute", "full"], "full"),
                                        (["--recompute", "selective"], "selective"), (["--no-recompute"], "none"),
                                        (["--selective-recompute"], "selective"),
                                        (["--recompute", "--no-recompute"], "none")])
def test_every_spelling_gives_one_mode(flags, mode):
    assert parse_config(["--model", "gpt", *flags]).stages.recompute == mode


@pytest.mark.parametrize("value,mode", [("true", "full"), ("false", "none"), ('"selective"', "selective")])
def test_a_config_files_bool_or_mode(tmp_path, value, mode):
    path = tmp_path / "run.toml"
    path.write_text(f"[stages]\nrecompute = {value}\n")
    assert parse_config(["--config", str(path)]).stages.recompute == mode


def test_the_engine_config_takes_a_bool_and_knows_whole_stage_recompute():
    assert StageConfig("auto", True).recompute == "full" and StageConfig("auto", True).full_recompute
    assert StageConfig("auto", False).recompute == "none"
    assert not StageConfig(recompute="selective").full_recompute
    with pytest.raises(ConfigError, match="stages.recompute"):
        StageConfig(recompute="some").validate()


def test_selective_is_the_gpts_and_the_gpt_workload_gets_it():
    cfg = parse_config(["--recompute", "selective"])
    with pytest.raises(ConfigError, match="--recompute selective applies to --model gpt and llama only"):
        cfg.validate(1, "cpu", registry.check_model)
    workload = registry.build_workload(parse_config(["--model", "gpt", "--selective-recompute"]))
    assert workload.parallelize.selective_recompute and not workload.full_recompute
