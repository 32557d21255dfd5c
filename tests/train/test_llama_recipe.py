"""The training recipe LLM users expect, and fine-tuning an imported model from the command line: the lr schedule
(warm-up, cosine / linear / constant decay to a floor) as numbers, its flags' rules in one line each, AdamW's decay
on matrices only, clipping on by default for the transformers; then an imported Hugging Face Llama fine-tuned by
the driver on two ranks (--config CKPT/model.toml --load CKPT --data TOKENS), resumed on one rank from its middle
checkpoint on exactly the same lr curve, and sampled by token ids."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

import hf_models
from hybrid_engine.config import ConfigError
from hybrid_engine.data import MarkovChain, write_token_file
from hybrid_engine.hf.convert import import_model
from hybrid_engine.metrics import records
from hybrid_engine.models import registry
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.parallelize import build_gpt
from hybrid_engine.models.llama.parallelize import build_llama
from hybrid_engine.optim.optimizers import AdamW, decays
from hybrid_engine.train import sample
from hybrid_engine.train.cli import parse_config
from hybrid_engine.train.lr_schedule import LRSchedule
from launch_utils import DRIVER, REPO, free_port
from test_llama_grids import config as llama_config


def test_the_schedule_warms_up_then_decays_to_its_floor():
    cosine = LRSchedule(1.0, warmup=4, decay="cosine", min_lr=0.1, decay_steps=14)
    assert [cosine.at(t) for t in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cosine.at(4) == 1.0 and cosine.at(9) == pytest.approx(0.55) and cosine.at(14) == cosine.at(99) == 0.1
    assert cosine.at(11) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.7)))
    linear = LRSchedule(2.0, decay="linear", min_lr=0.0, decay_steps=10)
    assert [linear.at(t) for t in (0, 5, 10)] == [2.0, 1.0, 0.0]
    assert [LRSchedule(0.5, warmup=2).at(t) for t in range(4)] == [0.25, 0.5, 0.5, 0.5]
    o = parse_config(["--lr", "3e-4", "--lr-warmup", "10", "--lr-decay", "cosine", "--min-lr", "3e-5",
                      "--steps", "100"]).optimizer
    assert LRSchedule.of(o, 100) == LRSchedule(3e-4, 10, "cosine", 3e-5, 100)
    o = parse_config(["--lr-decay-steps", "50", "--lr-decay", "linear"]).optimizer
    assert LRSchedule.of(o, 100).decay_steps == 50
    assert LRSchedule.of(parse_config([]).optimizer, 100).as_dict() == {"lr": 10.0, "warmup": 0, "decay": "constant",
                                                                       "min_lr": 0.0, "decay_steps": 0}


@pytest.mark.parametrize("flags, message", [
    (("--weight-decay", "0.1"), "--weight-decay applies to --optimizer adamw only (got sgd)"),
    (("--optimizer", "sgd", "--betas", "0.9,0.95"), "--betas applies to --optimizer adam and adamw only (got sgd)"),
    (("--optimizer", "adam", "--betas", "0.9"), "--betas takes two numbers B1,B2 (e.g. 0.9,0.95), got '0.9'"),
    (("--optimizer", "adamw", "--betas", "0.9,1.5"), "--betas must be two numbers in [0, 1), got '0.9,1.5'"),
    (("--lr-decay", "cosine", "--lr-warmup", "10", "--steps", "10"),
     "--lr-decay cosine needs --lr-decay-steps (default --steps) past --lr-warmup 10: there are no steps left to "
     "decay over"),
    (("--min-lr", "0.5", "--lr", "0.1"), "--min-lr must be a learning rate in [0, --lr 0.1], got 0.5"),
    (("--lr-warmup", "-1"), "--lr-warmup must be a number of steps >= 0, got -1"),
])
def test_a_bad_recipe_flag_is_one_line(flags, message):
    with pytest.raises(ConfigError) as err:
        parse_config(list(flags)).validate(1, "cpu", registry.check_model)
    assert str(err.value) == message


def test_adamw_decays_matrices_but_never_norms_biases_or_embeddings():
    gpt = build_gpt(GPTConfig(67, 1, 16, 2, 8, tie_embeddings=True), "meta")
    llama = build_llama(llama_config(True), "meta")
    for model in (gpt, llama):
        kept = {name for name, p in model.named_parameters() if not decays(p)}
        decayed = {name for name, p in model.named_parameters() if decays(p)}
        assert all(p.dim() == 1 or "word" in n or "position" in n or "lm_head" in n for n, p in
                   model.named_parameters() if n in kept), kept
        assert all(model.get_parameter(n).dim() == 2 for n in decayed) and "1.mlp_fc1.bias" not in decayed
    assert {"0.word", "5.lm_head.weight", "1.norm_attn.weight", "5.norm.weight"} <= {
        n for n, p in llama.named_parameters() if not decays(p)}
    opt = AdamW(lr=1e-3, weight_decay=0.1)([p for p in build_llama(llama_config(False)).parameters()])
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert len(opt.param_groups[1]["params"]) == 1 + 4 * 2 + 1  # the embedding, two norms a block, the final norm


def test_clipping_is_on_by_default_for_the_transformers_only():
    assert parse_config(["--model", "llama"]).precision.clip_grad is None
    for model, clip in (("llama", 1.0), ("gpt", 1.0), ("mlp", 0.0)):
        assert registry.entry(parse_config(["--model", model]).model.name).clip_grad == clip


def _ranks(world: int, args: list[str]) -> list[subprocess.CompletedProcess]:
    """The driver on `world` ranks started by hand (no launcher), each with its own output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=REPO, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for r in range(world)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=240)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def test_an_import_fine_tunes_on_two_ranks_resumes_on_one_on_its_lr_curve_and_samples(tmp_path, capsys):
    model = hf_models.make("gqa", str(tmp_path / "hf"))
    ckpt = str(tmp_path / "imported")
    import_model(str(tmp_path / "hf"), ckpt)
    tokens = str(tmp_path / "tokens.bin")
    write_token_file(tokens, MarkovChain(5, vocab=hf_models.VOCAB).sample(20_000, 7), hf_models.VOCAB)  # learnable
    recipe = ["--config", os.path.join(ckpt, "model.toml"), "--data", tokens, "--seq-len", "16", "--batch-size", "8",
              "--micro-batches", "2", "--optimizer", "adamw", "--lr", "3e-3", "--lr-warmup", "2", "--lr-decay",
              "cosine", "--min-lr", "3e-4", "--weight-decay", "0.1", "--betas", "0.9,0.95", "--steps", "6",
              "--quiet"]
    first = _ranks(2, [*recipe, "--mp", "2", "--sequence-parallel", "--load", ckpt, "--save", str(tmp_path / "a"),
                       "--save-every", "3", "--metrics", str(tmp_path / "a.jsonl")])
    assert all(r.returncode == 0 for r in first), first[0].stderr[-2000:] + first[1].stderr[-2000:]
    assert "gradient clipping: global norm 1 " in first[0].stdout
    assert f"started from {ckpt}" in first[0].stdout and "at its step 0" in first[0].stdout
    a = records.steps(records.read(tmp_path / "a.jsonl"))
    expected = LRSchedule(3e-3, 2, "cosine", 3e-4, 6)
    assert [r["lr"] for r in a] == [expected.at(t) for t in range(6)]
    assert a[-1]["loss"] < a[0]["loss"]
    manifest = json.load(open(tmp_path / "a" / "step_000003" / "manifest.json"))
    assert manifest["lr_schedule"] == expected.as_dict() and manifest["model"]["name"] == "llama"

    resumed = _ranks(1, [*recipe, "--load", str(tmp_path / "a" / "step_000003"), "--save", str(tmp_path / "b"),
                         "--metrics", str(tmp_path / "b.jsonl")])
    assert resumed[0].returncode == 0, resumed[0].stderr[-2000:]
    b = records.steps(records.read(tmp_path / "b.jsonl"))
    assert [r["step"] for r in b] == [3, 4, 5] and [r["lr"] for r in b] == [r["lr"] for r in a[3:]]
    for ours, theirs in zip(b, a[3:]):  # another grid: the same curve to rounding
        assert abs(ours["loss"] - theirs["loss"]) <= 1e-5 * theirs["loss"]

    assert sample.main(["--load", str(tmp_path / "b"), "--prompt-ids", "1,2,3", "--tokens", "5",
                        "--temperature", "0"]) == 0
    ids = [int(i) for i in capsys.readouterr().out.strip().split(",")]
    assert ids[:3] == [1, 2, 3] and len(ids) == 8 and all(0 <= i < hf_models.VOCAB for i in ids)
    del model
