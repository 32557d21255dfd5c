"""The run's typed configuration, in this process (no ranks): flags and --config TOML files onto RunConfig (flags
win), one-line errors for unknown keys and wrong types, every number range-checked before setup, a launch hint
without a launcher, and a --help a user can read."""
import math

import pytest

from hybrid_engine import optim
from hybrid_engine.train import cli
from hybrid_engine.models import registry
from hybrid_engine.train.cli import build_parser, parse_config
from hybrid_engine.config.run import ConfigError, LaunchEnv, RunConfig
from hybrid_engine.config.engine import ScheduleConfig, StageConfig


def write(tmp_path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


RUN = """
[parallel]
pp = 2
comm_timeout = 15.0

[model]
dim = 64
depth = 4

[schedule]
name = "zb1"
micro_batches = 8
merge_weight_grads = true

[stages]
impl = "autograd"

[training]
steps = 7

[reporting]
quiet = true
"""


def test_toml_file_fills_every_table(tmp_path):
    cfg = parse_config(["--config", write(tmp_path, RUN)])
    assert (cfg.parallel.pp, cfg.parallel.comm_timeout, cfg.model.dim, cfg.model.depth) == (2, 15.0, 64, 4)
    # what the file leaves out of [schedule] is the planner's (auto: None)
    assert cfg.schedule == ScheduleConfig(name="zb1", micro_batches=8, virtual_stages=None, lookahead=None,
                                          merge_weight_grads=True)
    assert cfg.stages == StageConfig(impl="autograd")
    assert cfg.training.steps == 7 and cfg.reporting.quiet
    assert cfg.data == RunConfig().data  # a table left out keeps its defaults


def test_flags_override_the_file_and_only_flags_given_do(tmp_path):
    cfg = parse_config(["--config", write(tmp_path, RUN), "--dim", "128", "--schedule", "1f1b",
                            "--no-merge-wgrad", "--no-quiet", "--lr", "0.5"])
    assert cfg.model.dim == 128 and cfg.model.depth == 4  # depth: from the file, not the flag's default
    assert cfg.schedule.name == "1f1b" and cfg.schedule.micro_batches == 8 and not cfg.schedule.merge_weight_grads
    assert not cfg.reporting.quiet and cfg.optimizer.lr == 0.5
    assert cfg.parallel.pp == 2  # not given on the command line: the file's value stands


def test_no_flags_and_no_file_give_the_dataclass_defaults():
    assert parse_config([]) == RunConfig.from_tables({}, registry.options())


@pytest.mark.parametrize("text,message", [
    ("[paralel]\npp = 2\n", "unknown table [paralel]"),
    ("[model]\ndepht = 3\n", "unknown key model.depht"),
    ("[model]\ndim = \"32\"\n", "model.dim must be an integer, got '32'"),
    ("[reporting]\nquiet = 1\n", "reporting.quiet must be true or false, got 1"),
    ("[optimizer]\nlr = true\n", "optimizer.lr must be a number, got True"),
    ("model = 3\n", "'model' must be a table"),
    ("[model\n", "is not valid TOML"),
])
def test_a_bad_file_is_one_line_naming_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=None) as info:
        parse_config(["--config", path])
    assert message in str(info.value) and path in str(info.value)
    assert "\n" not in str(info.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        parse_config(["--config", str(tmp_path / "none.toml")])


def test_stage_impl_replaces_the_old_stage_flags():
    assert parse_config(["--stage-impl", "autograd", "--recompute", "--compile"]).stages == \
        StageConfig(impl="autograd", recompute=True, compile=True)
    for old in ("--no-fuse", "--autograd-stages"):
        with pytest.raises(ConfigError, match="unrecognized arguments"):
            parse_config([old])


def validate(*flags: str, world: int = 1, device: str = "cpu"):
    return parse_config(list(flags)).validate(world, device, registry.check_model)


@pytest.mark.parametrize("flags,message", [
    (("--batch-size", "0"), "--batch-size must be >= 1, got 0"),
    (("--schedule", "1f1b", "--merge-wgrad"), "applies to the zb1 and zbv schedules only (got 1f1b)"),
    (("--dim", "2147483648"), "--dim 2147483648 is too large"),
    (("--depth", "4294967296"), "--depth 4294967296 is too large"),
    (("--lookahead", "2147483648"), "--lookahead 2147483648 is too large"),
    (("--lookahead", "5", "--micro-batches", "4"), "--lookahead 5 is more than the 4 micro-batches of a step"),
    (("--lr", "-1"), "--lr must be a learning rate in [0, 3e+38], got -1.0"),
    (("--lr", "1e308"), "--lr must be a learning rate"),
    (("--lr", "nan"), "--lr must be a finite number"),
    (("--comm-timeout", "0"), "--comm-timeout must be a positive number of seconds"),
    (("--comm-timeout", "-1"), "--comm-timeout must be a positive number of seconds"),
    (("--comm-timeout", "nan"), "--comm-timeout must be a finite number"),
    (("--comm-timeout", "inf"), "--comm-timeout must be a finite number"),
    (("--clip-grad", "-1"), "--clip-grad must be a gradient norm >= 0"),
    (("--clip-grad", "nan"), "--clip-grad must be a finite number"),
    (("--clip-grad", "inf"), "--clip-grad must be a finite number"),
    (("--scale-window", "0"), "--scale-window must be a number of clean steps >= 1, got 0"),
    (("--hysteresis", "0"), "--hysteresis must be a number of overflows >= 1"),
    (("--steps", "-1"), "--steps must be a number of steps >= 0"),
    (("--warmup", "-1"), "--warmup must be a number of steps >= 0"),
    (("--log-every", "0"), "--log-every must be a number of steps >= 1"),
    (("--spike-factor", "1"), "--spike-factor must be 0 (off) or a factor > 1, got 1.0"),
    (("--spike-factor", "nan"), "--spike-factor must be a finite number"),
    (("--memory-cap-gib", "-1"), "--memory-cap-gib must be a positive number of GiB"),
    (("--seed", "-1"), "--seed must be in [0, 2^63 - 1]"),
    (("--seed", str(2**63)), "--seed must be in [0, 2^63 - 1]"),
    (("--loss-scale", "0", "--amp", "fp16"), "--loss-scale must be a positive loss scale"),
    (("--keep-checkpoints", "0"), "--keep-checkpoints >= 1"),
    (("--pp", "0"), "--pp must be >= 1, got 0"),
    (("--dp", "-1099511627776"), "--dp must be >= 1"),
    (("--micro-batches", "-1099511627776"), "--micro-batches -1099511627776 is too large"),
    (("--schedule", "1f1b", "--micro-batches", "0"), "micro-batches must be >= 1 (got 0)"),
    (("--order", "mp-dp"), "grid order 'mp-dp' must name dp, pp and mp once each"),
    (("--resume",), "--resume and --save-every need --save DIR"),
    (("--fp32-residual",), "--fp32-residual applies to --model gpt only"),
    (("--model", "gpt", "--fp32-residual"), "--fp32-residual applies to --amp fp16|bf16 with half weights"),
    (("--model", "gpt", "--fp32-residual", "--amp", "bf16", "--amp-impl", "autocast"),
     "the residual stream is fp32 already"),
])
def test_every_number_and_flag_is_checked_before_setup_with_one_line(flags, message):
    with pytest.raises(ConfigError) as info:
        validate(*flags)
    assert message in str(info.value), str(info.value)


def test_fp32_residual_passes_with_half_weights():
    assert parse_config(["--model", "gpt", "--fp32-residual", "--amp", "bf16"]).model.fp32_residual
    validate("--model", "gpt", "--fp32-residual", "--amp", "bf16")


def test_the_largest_sane_numbers_pass():
    grid = validate("--dim", "65536", "--depth", "4096", "--seed", str(2**63 - 1), "--lookahead", "4",
                    "--comm-timeout", "0.5", "--lr", "0")
    assert grid.world_size == 1


def test_without_a_launcher_a_grid_of_several_ranks_says_how_to_launch():
    argv = ["--dp", "2", "--pp", "2", "--mp", "2"]
    cfg = parse_config(argv)
    with pytest.raises(ConfigError) as info:
        cli.validate_launch(cfg, LaunchEnv(0, 1, 0, launched=False), "cpu", argv, "hybrid_engine.py")
    assert str(info.value) == ("grid dp x pp x mp = 2 x 2 x 2 = 8 != world size 1 (this is one process: to start 8 "
                               "ranks, run torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2)")
    with pytest.raises(ConfigError) as info:  # under a launcher the plain mismatch is the whole story
        cli.validate_launch(cfg, LaunchEnv(0, 1, 0, launched=True), "cpu", argv, "hybrid_engine.py")
    assert "torchrun" not in str(info.value)


def test_help_lists_every_flag_once_with_its_real_default_and_the_launch_examples():
    text = build_parser("hybrid_engine.py").format_help()
    assert "(default: None)" not in text and "(default: False)" not in text and "default: %" not in text
    for piece in ("--comm-timeout SECONDS", "(default 60.0)", "{sgd,adam,adamw}", "{auto,native,autograd}",
                  "mp-dp-pp, mp-pp-dp", "torchrun --nproc_per_node=8 hybrid_engine.py --dp 2 --pp 2 --mp 2",
                  "HYBRID_ENGINE_DEBUG=1", "HYBRID_ENGINE_TEST_NAN_AT_STEP", "--config TOML"):
        assert piece in text, piece
    parser = build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "config"):
            assert action.help.count("(default") == 1, action.option_strings  # exactly once, ours


def test_optimizer_config_makes_a_factory():
    import torch

    chosen = parse_config(["--optimizer", "adamw", "--lr", "0.25"]).optimizer
    factory = optim.from_name(chosen.name, chosen.lr)
    opt = factory([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(opt, torch.optim.AdamW) and math.isclose(opt.param_groups[0]["lr"], 0.25)


@pytest.mark.parametrize("device", ["tpu", "CUDA", "Cpu", ""])
def test_a_config_files_device_has_the_flags_choices(tmp_path, device):
    # the flag refuses these (argparse choices); a --config file's value must be refused alike, never run on the CPU
    cfg = parse_config(["--config", write(tmp_path, f'[parallel]\ndevice = "{device}"\n')])
    with pytest.raises(ConfigError) as info:
        cfg.validate(1, "cpu", registry.check_model)
    assert str(info.value) == f"parallel.device (--device) must be one of auto, cpu, cuda, got {device!r}"


@pytest.mark.parametrize("value", ["1e308", "inf", "nan"])
def test_a_dp_bucket_size_beyond_a_tebibyte_is_one_line(tmp_path, value):
    cfg = parse_config(["--config", write(tmp_path, f"[data_parallel]\nbucket_mb = {value}\n")])
    with pytest.raises(ConfigError) as info:  # 1e308 MiB in bytes does not fit the engine's integer sizes
        cfg.validate(1, "cpu", registry.check_model)
    assert "bucket" in str(info.value) and value.replace("1e308", "1e+308") in str(info.value), str(info.value)
