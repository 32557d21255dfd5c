"""Hugging Face Llama-family models in and out, in this process: tiny random models made by `transformers` (GQA with
RoPE, tied embeddings with Llama 3 scaling, Qwen2's q/k/v biases, Mistral's window) import into a checkpoint whose
dense model gives transformers' logits to 1e-5 in fp32 and its greedy generation; export(import(x)) writes x's
safetensors byte for byte; an export transformers loads gives the same logits; sharded files stream both ways;
anything unsupported is one line and exit 2."""
from __future__ import annotations

import json
import os

import pytest
import torch

import hf_models
from hybrid_engine.checkpoint import open_checkpoint, read_weights, write_checkpoint
from hybrid_engine.data import prepare, read_header
from hybrid_engine.hf import __main__ as hf_cli
from hybrid_engine.hf.convert import export_model, import_model
from hybrid_engine.models.decoder import generate
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.parallelize import build_llama
from hybrid_engine.models.llama.workload import llama_checkpoint_model, llama_config_of
from hybrid_engine.train import sample

pytest.importorskip("transformers")
TOKENS = torch.randint(0, hf_models.VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{kind: (the transformers model, its directory, the imported checkpoint)}."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for kind in hf_models.KINDS:
        model = hf_models.make(kind, str(root / kind))
        path, notes = import_model(str(root / kind), str(root / f"{kind}_ckpt"))
        out[kind] = (model, str(root / kind), str(root / f"{kind}_ckpt"), notes)
    return out


def dense(ckpt: str):
    c = open_checkpoint(ckpt)
    model = build_llama(llama_config_of(c.manifest["model"]))
    model.load_state_dict(dict(read_weights(c)))
    return model.eval()


def test_an_imported_model_gives_the_logits_of_transformers(models):
    for kind, (model, _, ckpt, _) in models.items():
        ours, theirs = dense(ckpt)(TOKENS).detach(), hf_models.hf_logits(model, TOKENS)
        err = ((ours - theirs).norm() / theirs.norm()).item()
        assert err < 1e-5, (kind, err)
    assert models["mistral"][3] == ["note: sliding_window 32: max_positions capped at it (attention within the "
                                    "window is full causal attention, which is what the engine computes)"]
    toml = open(os.path.join(models["tied"][2], "model.toml")).read()
    assert 'rope_scaling = "8,1,4,16"' in toml and "tie_embeddings = true" in toml and "kv_heads = 1" in toml


def test_greedy_generation_matches_transformers_generate(models):
    for kind in ("gqa", "tied", "qwen2"):
        model, _, ckpt, _ = models[kind]
        prompt = TOKENS[:1, :5]
        ours = generate(dense(ckpt), prompt, 12, temperature=0.0)
        theirs = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert ours.tolist() == theirs.tolist(), kind


def test_sample_prints_the_greedy_ids_of_an_import(models, capsys):
    model, _, ckpt, _ = models["gqa"]
    assert sample.main(["--load", ckpt, "--prompt-ids", "1,2,3", "--tokens", "6", "--temperature", "0"]) == 0
    printed = capsys.readouterr().out.strip()
    theirs = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert printed == ",".join(map(str, theirs[0].tolist()))
    assert sample.main(["--load", ckpt, "--prompt-ids", "1,x"]) == 2
    assert capsys.readouterr().err.strip() == "error: --prompt-ids takes comma-separated token ids (e.g. 1,2,3), got '1,x'"


def test_export_of_an_import_is_the_same_bytes_and_loads_in_transformers(models, tmp_path):
    from transformers import AutoModelForCausalLM

    for kind, (model, hf_dir, ckpt, _) in models.items():
        like = tmp_path / f"{kind}_like"
        export_model(ckpt, str(like), like=hf_dir)
        for name in ("model.safetensors", "config.json", "generation_config.json"):
            assert (like / name).read_bytes() == open(os.path.join(hf_dir, name), "rb").read(), (kind, name)
        plain = tmp_path / f"{kind}_plain"
        export_model(ckpt, str(plain))
        assert (plain / "model.safetensors").read_bytes() == (like / "model.safetensors").read_bytes(), kind
        loaded = AutoModelForCausalLM.from_pretrained(str(plain)).eval()
        assert type(loaded).__name__ == ("Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM")
        assert torch.equal(hf_models.hf_logits(loaded, TOKENS[:, :16]), hf_models.hf_logits(model, TOKENS[:, :16]))


def test_sharded_files_stream_both_ways_and_bf16_stays_bf16(models, tmp_path):
    """A 4 KiB shard cap cuts the export into many safetensors and an index; importing that directory gives the
    same checkpoint tensors. A bf16 export imports as bf16 and exports back unchanged."""
    _, hf_dir, ckpt, _ = models["gqa"]
    export_model(ckpt, str(tmp_path / "sharded"), like=hf_dir, max_shard_bytes=4096)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 10
    import_model(str(tmp_path / "sharded"), str(tmp_path / "again"))
    first, again = (dict(read_weights(open_checkpoint(p))) for p in (ckpt, str(tmp_path / "again")))
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    export_model(ckpt, str(tmp_path / "bf16"), dtype="bf16")
    import_model(str(tmp_path / "bf16"), str(tmp_path / "bf16_ckpt"))
    assert {e["dtype"] for e in open_checkpoint(str(tmp_path / "bf16_ckpt")).manifest["params"].values()} == {"bfloat16"}
    export_model(str(tmp_path / "bf16_ckpt"), str(tmp_path / "bf16_again"))
    assert (tmp_path / "bf16_again" / "model.safetensors").read_bytes() == (
        tmp_path / "bf16" / "model.safetensors").read_bytes()


def _edit_config(src: str, dst, **changes) -> str:
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))
    return str(dst)


def test_what_the_engine_cannot_honour_is_one_line_naming_it(models, tmp_path, capsys):
    _, hf_dir, ckpt, _ = models["gqa"]
    cases = [
        (dict(architectures=["GPT2LMHeadModel"]), "architecture ['GPT2LMHeadModel'] is not supported"),
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported (only 'silu')"),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
         "RoPE scaling of rope_type 'yarn' is not supported"),
        (dict(quantization_config={"bits": 4}), "key 'quantization_config' is not supported for LlamaForCausalLM"),
        (dict(attention_bias=True), "attention_bias true is not supported"),
        (dict(num_hidden_layers=5), "tensor model.layers.4.input_layernorm.weight is missing"),
    ]
    for i, (change, message) in enumerate(cases):
        bad = _edit_config(hf_dir, tmp_path / f"bad{i}", **change)
        assert hf_cli.main(["import", bad, str(tmp_path / f"out{i}")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and message in err, (message, err)
        assert not os.path.exists(tmp_path / f"out{i}" / "latest")
    assert hf_cli.main(["import", hf_dir, ckpt]) == 2  # a directory that holds checkpoints already
    assert "already holds checkpoints" in capsys.readouterr().err
    assert hf_cli.main(["export", ckpt, str(tmp_path / "exp")]) == 0
    assert hf_cli.main(["export", ckpt, str(tmp_path / "exp")]) == 2
    assert "exists: pass --force to replace it" in capsys.readouterr().err


def test_data_prepare_and_sample_take_a_hugging_face_tokenizer(tmp_path, capsys):
    """A model directory's tokenizer.json (a tiny BPE standing in for a real one) tokenizes a text without special
    tokens, its SHA-256 recorded; sample decodes with the directory."""
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

    text = tmp_path / "book.txt"
    text.write_text("the engine trains the models people use\n" * 200)
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(text)], trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"], show_progress=False,
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    tok.save(str(hf_dir / "tokenizer.json"))
    count, vocab = prepare(str(text), str(tmp_path / "book.tok"), tokenizer=str(hf_dir))
    assert vocab == tok.get_vocab_size() and count == len(tok.encode(text.read_text()).ids)
    import hashlib
    assert read_header(str(tmp_path / "book.tok")).tokenizer_sha256 == hashlib.sha256(
        (hf_dir / "tokenizer.json").read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="give one of them"):
        prepare(str(text), str(tmp_path / "x.tok"), bpe=300, tokenizer=str(hf_dir))
    cfg = LlamaConfig(vocab, 1, 16, 2, 1, 32, 16, max_positions=64)
    write_checkpoint(str(tmp_path / "ckpt"), llama_checkpoint_model(cfg), [build_llama(cfg).state_dict()])
    assert sample.main(["--load", str(tmp_path / "ckpt"), "--prompt", "the engine", "--tokens", "4",
                        "--temperature", "0", "--tokenizer", str(hf_dir)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("the engine") and "it was trained on no token file: an import" in out.err
