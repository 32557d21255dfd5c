"""The model registry: every part of the engine that knows a model asks it; a model from outside registers in one
line, scoped, and the built-in models keep the seed streams (so the draws) they always had."""
import dataclasses
import re

import pytest
import torch

from checkpoint_fakes import write_gpt_checkpoint
from hybrid_engine.checkpoint import CheckpointError
from hybrid_engine.config.engine import ConfigError
from hybrid_engine.config.flags import parse_config
from hybrid_engine.hf.convert import export_model
from hybrid_engine.models import ModelEntry, RegistryError, register, registered, registry, stream_seed
from hybrid_engine.models.gpt.model import GPTConfig, layer_seed as gpt_layer_seed
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.model import layer_seed as llama_layer_seed
from hybrid_engine.models.mlp.model import SeededLinear
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.setting import Setting
from tiny_model import ENTRY, TinyOptions


def test_the_built_in_models_in_order_with_the_seed_streams_they_always_drew_from():
    assert registry.names() == ("mlp", "gpt", "llama")
    assert [registry.entry(n).seed_streams for n in registry.names()] == [(1, 2, 3), (4,), (5,)]
    assert SeededLinear(4, 4, seed=7, layer=3, device="meta").init_seed == stream_seed(7, 1, 3)
    assert gpt_layer_seed(GPTConfig(256, 2, 8, 2, 8, seed=7), 2) == stream_seed(7, 4, 2)
    assert llama_layer_seed(LlamaConfig(256, 2, 8, 2, 2, 16, 8, seed=7), 2) == stream_seed(7, 5, 2)
    assert [registry.entry(n).clip_grad for n in registry.names()] == [0.0, 1.0, 1.0]


def test_a_registered_model_is_the_configs_the_planners_and_gets_the_next_stream_then_is_gone():
    with registered("tiny", ENTRY) as tiny:
        assert tiny.seed_streams == (6,) and tiny.title == "tiny"
        assert registry.names() == ("mlp", "gpt", "llama", "tiny")
        cfg = parse_config(["--model", "tiny", "--width", "4", "--blocks", "3"], registry.options())
        assert cfg.model.options == TinyOptions(width=4, blocks=3)
        assert cfg.optimizer.name == "adam"  # the model's own default, from its options
        shape = shape_of(cfg)
        assert (shape.name, len(shape.layers), shape.cut(2)) == ("tiny", 3, [[0, 1], [2]])
        assert Setting.of(cfg, 1, 1, 1).clip is False
        workload = registry.build_workload(cfg)
        assert workload.layout(2) == [[0, 1, 2, 3, 4, 5], [6, 7, 8]]
        with pytest.raises(RegistryError, match="model 'tiny' is registered already"):
            register("tiny", ENTRY)
    assert "tiny" not in registry.names()
    with pytest.raises(ConfigError, match=r"no model named 'tiny' is registered \(models: mlp, gpt, llama\)"):
        registry.entry("tiny")
    with registered("tiny", ENTRY) as again:  # the stream it had is free again
        assert again.seed_streams == (6,)


def test_an_unknown_model_is_an_error_for_the_planner_never_the_llama():
    cfg = parse_config(["--model", "llama"], registry.options())
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name="mystery"))
    with pytest.raises(ConfigError, match="no model named 'mystery' is registered"):
        shape_of(cfg)
    with pytest.raises(ConfigError, match="no model named 'mystery' is registered"):
        Setting.of(cfg, 1, 1, 1)


@pytest.mark.parametrize("change, message", [
    (dict(shape=None), "a model entry needs shape: shape(cfg) -> ModelShape"),
    (dict(parallelize=None), "a model entry needs parallelize"),
    (dict(build=3), "a model entry's build must be callable"),
    (dict(options=dict), "a model entry's options must be a dataclass type"),
    (dict(options=dataclasses.make_dataclass("Bare", [("width", int, 8)])),
     "a model entry's options Bare have no OPTIMIZER: its default (optimizer, lr)"),
    (dict(seed_streams=(0,)), "seed_streams must be a tuple of positive integers"),
    (dict(hf="hybrid_engine.hf.llama"), "a model entry's hf must be a module name, beside a sampler"),
])
def test_a_missing_or_wrong_field_is_one_line(change, message):
    fields = {f.name: getattr(ENTRY, f.name) for f in dataclasses.fields(ENTRY)} | change
    with pytest.raises(RegistryError, match=re.escape(message)):
        ModelEntry(**fields)


def test_a_duplicate_name_a_bad_name_or_a_taken_stream_is_refused():
    with pytest.raises(RegistryError, match="model 'gpt' is registered already"):
        register("gpt", ENTRY)
    with pytest.raises(RegistryError, match="lower-case letters"):
        register("Tiny Model", ENTRY)
    with pytest.raises(RegistryError, match=r"draws from seed streams \(4,\), which gpt draws from: the registry gives "
                                            r"it \(6,\)"):
        register("tiny", dataclasses.replace(ENTRY, seed_streams=(4,)))
    with pytest.raises(RegistryError, match="another model's checkpoints are named 'large_linear_model'"):
        register("tiny", dataclasses.replace(ENTRY, checkpoint_name="large_linear_model"))
    assert registry.names() == ("mlp", "gpt", "llama")


def test_a_workload_that_splits_with_another_plan_than_its_entrys_is_refused():
    with registered("tiny", dataclasses.replace(ENTRY, parallelize=lambda stage, group: stage)):
        cfg = parse_config(["--model", "tiny"], registry.options())
        with pytest.raises(RegistryError, match="its workload splits the model with .*parallelize_mlp"):
            registry.build_workload(cfg)


def test_hf_export_asks_the_registry_which_models_have_a_mapping(tmp_path):
    path = write_gpt_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"holds the GPT \(--model gpt\), which has no Hugging Face mapping: "
                                              r"export writes a checkpoint of --model llama"):
        export_model(path, str(tmp_path / "hf"))


def test_the_tiny_model_draws_from_its_stream_whatever_the_grid():
    with registered("tiny", ENTRY):
        cfg = parse_config(["--model", "tiny", "--width", "4"], registry.options())
        data = registry.build_workload(cfg).data
        x, y = data.draw(3, 0, 6)
        assert torch.equal(data.draw(3, 2, 5)[0], x[2:5]) and torch.equal(y, torch.sin(x))
