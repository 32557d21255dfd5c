"""The converter on inputs a hostile or unlucky user hands it, in this process (tiny random models made by
`transformers`, no download): a folder it writes holds exactly what it wrote; it respects a run's checkpoint
directory; non-finite weights, a --like that computes another function, an edited manifest, wrong-typed or
oversized config values, a FIFO in a sharded index and an output that is a file are each one line and exit 2,
before the work they would imply."""
from __future__ import annotations

import json
import os
import shutil
import threading

import pytest
import torch

import hf_models
from hybrid_engine.checkpoint import open_checkpoint, read_weights
from hybrid_engine.checkpoint.lock import hold_directory
from hybrid_engine.hf import __main__ as hf_cli
from hybrid_engine.hf.convert import export_model, import_model
from hybrid_engine.hf.hf_config import HFError, llama_config_from_hf

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{kind: (its HF directory, its imported checkpoint)} for two same-shaped Llamas, a Mistral and another
    Llama of other weights."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hf_faults")
    out = {}
    for kind, seed in (("gqa", 0), ("mistral", 0), ("other", 1)):
        hf_models.make("gqa" if kind == "other" else kind, str(root / kind), seed=seed)
        import_model(str(root / kind), str(root / f"{kind}_ckpt"))
        out[kind] = (str(root / kind), str(root / f"{kind}_ckpt"))
    return out


def _one_line(capsys, argv: list[str]) -> str:
    assert hf_cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    return captured.err.strip()[len("error: "):]


def _weights(path: str) -> dict[str, torch.Tensor]:
    return dict(read_weights(open_checkpoint(path)))


def _copy_with(src: str, dst, config: dict | None = None, tensors: dict | None = None) -> str:
    """A copy of HF directory src with config.json keys replaced (... removes one) and tensors replaced."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config:
        held = json.loads((dst / "config.json").read_text())
        held.update(config)
        (dst / "config.json").write_text(json.dumps({k: v for k, v in held.items() if v is not ...}))
    if tensors:
        weights = load_file(str(dst / "model.safetensors")) | tensors
        save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def _with_weights(ckpt: str, path, change) -> str:
    """A weights-only checkpoint of ckpt's model at `path`, each tensor passed through change(name, tensor)."""
    from hybrid_engine.checkpoint import write_checkpoint

    modules: dict[str, dict] = {}
    for name, tensor in _weights(ckpt).items():
        modules.setdefault(name.split(".")[0], {})[name] = change(name, tensor)
    write_checkpoint(str(path), open_checkpoint(ckpt).manifest["model"], list(modules.values()))
    return str(path)


def _litter(folder) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*") if ".shard_" in p.name or ".partial_" in p.name
                  or ".old_" in p.name)


# ---------------------------------------------------------------- 2. a folder holds exactly what was written
def test_a_replaced_export_holds_only_the_new_model(tiny, tmp_path, capsys):
    (_, a), (_, b) = tiny["gqa"], tiny["other"]
    out = tmp_path / "out"
    export_model(a, str(out), max_shard_bytes=4096)  # many shards and an index
    assert (out / "model.safetensors.index.json").exists()
    export_model(b, str(out), force=True)  # one file: the index and shards of A must go
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    import_model(str(out), str(tmp_path / "back"))
    got, want = _weights(str(tmp_path / "back")), _weights(b)
    assert all(torch.equal(got[k], want[k]) for k in want)
    export_model(a, str(out), max_shard_bytes=4096, force=True)  # and the other way round
    assert not (out / "model.safetensors").exists() and (out / "model.safetensors.index.json").exists()
    (out / "notes.txt").write_text("mine")
    message = _one_line(capsys, ["export", b, str(out), "--force"])
    assert message == (f"HF_DIR {out} holds notes.txt, which an export does not write: export into a new or empty "
                       "folder (an export replaces the folder it writes)")
    assert (out / "notes.txt").read_text() == "mine" and _litter(tmp_path) == []


def test_a_failed_export_leaves_the_folder_as_it_was_and_no_partial_file(tiny, tmp_path, capsys):
    _, ckpt = tiny["gqa"]
    out = tmp_path / "out"
    export_model(ckpt, str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    last = list(_weights(ckpt))[-1]  # written after the first shards: refused mid-stream
    huge = _with_weights(ckpt, tmp_path / "huge", lambda name, t: t.clone().fill_(1e6) if name == last else t)
    assert hf_cli.main(["export", str(huge), str(out), "--force", "--dtype", "fp16", "--max-shard-gib",
                        str(4096 / 2**30)]) == 2
    capsys.readouterr()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _litter(tmp_path) == []


# ------------------------------------------------------------ 3. a run's checkpoint directory is the run's
def test_the_converter_respects_a_runs_checkpoint_directory(tiny, tmp_path, capsys):
    hf_dir, ckpt = tiny["gqa"]
    run = tmp_path / "run"
    run.mkdir()
    hold = hold_directory(str(run), 0, 1)  # a run training into it
    try:
        message = _one_line(capsys, ["import", hf_dir, str(run)])
        assert message.startswith(f"CKPT {run} is in use by another run (pid {os.getpid()} on ")
        assert sorted(p.name for p in run.iterdir()) == [".lock"]
        for out in (run / "exported", run / "step_000005"):
            assert _one_line(capsys, ["export", ckpt, str(out)]) == (
                f"HF_DIR {out} is inside {run}, a checkpoint directory of a run: the run prunes and replaces what "
                "is there; export elsewhere")
    finally:
        hold.release()
    for out in (os.path.join(ckpt, "step_000000"), os.path.join(ckpt, "exported")):  # a finished run's, too
        assert "a checkpoint directory of a run" in _one_line(capsys, ["export", tiny["other"][1], out])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "model.toml").write_text("# my run's model\n")
    assert _one_line(capsys, ["import", hf_dir, str(mine)]) == (
        f"{mine / 'model.toml'} exists: an import writes a new checkpoint directory (choose another)")
    assert (mine / "model.toml").read_text() == "# my run's model\n" and not (mine / "latest").exists()


# ------------------------------------------------------------------------------------ 4. non-finite weights
def test_non_finite_weights_are_refused_both_ways(tiny, tmp_path, capsys):
    hf_dir, ckpt = tiny["gqa"]
    name = "model.layers.1.mlp.up_proj.weight"
    from safetensors.torch import load_file

    good = load_file(os.path.join(hf_dir, "model.safetensors"))[name]
    for i, bad in enumerate((float("nan"), float("inf"))):
        tensor = good.clone()
        tensor[3, 5] = bad
        src = _copy_with(hf_dir, tmp_path / f"bad{i}", tensors={name: tensor})
        assert _one_line(capsys, ["import", src, str(tmp_path / f"ck{i}")]) == (
            f"tensor {name} holds NaN or infinite values: training or sampling it gives NaN; a damaged or diverged "
            "model")
        assert not (tmp_path / f"ck{i}" / "latest").exists()
    big = _with_weights(ckpt, tmp_path / "big", lambda n, t: t.clone().fill_(1e6) if n == "2.mlp_up.weight" else t)
    assert _one_line(capsys, ["export", big, str(tmp_path / "fp16"), "--dtype", "fp16"]) == (
        "2.mlp_up.weight holds values beyond torch.float16's range (largest magnitude 1e+06): they would be written "
        "as infinite; choose a wider --dtype")
    assert not (tmp_path / "fp16").exists() and _litter(tmp_path) == []
    assert hf_cli.main(["export", big, str(tmp_path / "fp32"), "--dtype", "fp32"]) == 0  # it fits fp32
    capsys.readouterr()


# --------------------------------------------------------------- 5. the same name for another function
def test_like_and_the_manifest_must_describe_the_checkpoints_function(tiny, tmp_path, capsys):
    (mistral_dir, _), (_, llama) = tiny["mistral"], tiny["gqa"]
    assert _one_line(capsys, ["export", llama, str(tmp_path / "as_mistral"), "--like", mistral_dir]) == (
        f"--like {mistral_dir}: its sliding_window 32 cuts attention to 32 tokens, but the checkpoint attends over "
        "64 positions: logits of longer sequences would differ")
    edited = tmp_path / "edited"
    shutil.copytree(llama, edited)
    manifest_path = edited / "step_000000" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["model"]["vocab_size"] = 100
    manifest_path.write_text(json.dumps(manifest))
    message = _one_line(capsys, ["export", str(edited), str(tmp_path / "x")])
    assert message.startswith(f"checkpoint {edited / 'step_000000'}: its manifest describes a Llama (vocabulary 100, "
                              "4 layers, hidden 32) whose model.embed_tokens.weight is [100, 32], but its tensors give "
                              f"[{hf_models.VOCAB}, 32]"), message
    manifest["model"] |= {"vocab_size": hf_models.VOCAB, "layers": 10**7}  # 10^7 layers: refused before any work
    manifest_path.write_text(json.dumps(manifest))
    assert "a model the engine refuses to train (--layers 10000000 is too large" in _one_line(
        capsys, ["export", str(edited), str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------- 11. config values of the wrong type, or a run refuses
def test_a_config_value_of_the_wrong_kind_is_one_line_naming_it(tiny, tmp_path, capsys):
    hf_dir, ckpt = tiny["gqa"]
    mistral_dir = tiny["mistral"][0]
    llama3 = dict(hf_models.LLAMA3)
    cases = [
        (hf_dir, dict(rope_theta="abc"), 'rope_theta "abc" is not a number'),
        (hf_dir, dict(max_position_embeddings=None), "max_position_embeddings null is not a number"),
        (hf_dir, dict(rope_parameters="garbage"), 'rope_parameters "garbage" is not an object'),
        (mistral_dir, dict(sliding_window="32"), 'sliding_window "32" is not a number'),
        (hf_dir, dict(hidden_size=32.7), "hidden_size 32.7 is not a whole number"),
        (hf_dir, dict(tie_word_embeddings="yes"), 'tie_word_embeddings "yes" is not true or false'),
        (hf_dir, dict(rope_scaling=llama3 | {"factor": -8.0}),
         "rope_scaling is a llama3 scaling the engine refuses (--rope-scaling '-8,1,4,16': needs factor >= 1"),
        (hf_dir, dict(max_position_embeddings=10**12), "a model the engine refuses to train (--max-positions"),
    ]
    for i, (src, change, message) in enumerate(cases):
        bad = _copy_with(src, tmp_path / f"bad{i}", config=change)
        got = _one_line(capsys, ["import", bad, str(tmp_path / f"out{i}")])
        assert got.startswith(f"{os.path.join(bad, 'config.json')}: {message}"), (message, got)
        assert not os.path.exists(tmp_path / f"out{i}")
    from safetensors.torch import load_file

    name = "model.norm.weight"
    fp8 = load_file(os.path.join(hf_dir, "model.safetensors"))[name].to(torch.float8_e4m3fn)
    bad = _copy_with(hf_dir, tmp_path / "fp8", tensors={name: fp8})
    assert _one_line(capsys, ["import", bad, str(tmp_path / "fp8_out")]) == (
        f"tensor {name} is [32] torch.float8_e4m3fn; this config needs [32] of float32, float16, bfloat16, float64")
    # the export's own arguments
    assert _one_line(capsys, ["export", ckpt, str(tmp_path / "e"), "--max-shard-gib", "inf"]) == (
        "--max-shard-gib must be a positive number of GiB, got inf")
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    assert _one_line(capsys, ["export", ckpt, str(a_file)]) == f"HF_DIR {a_file} is a file, not a folder: give a " \
        "folder to write into"
    assert _one_line(capsys, ["import", hf_dir, str(a_file)]) == f"CKPT {a_file} is a file, not a folder: give a " \
        "folder to write into"
    assert a_file.read_text() == "mine"
    # and never over what it reads
    assert _one_line(capsys, ["import", hf_dir, os.path.join(hf_dir, "ck")]) == (
        f"CKPT {os.path.join(hf_dir, 'ck')} is inside HF_DIR {hf_dir}: writing there would change what is read (give "
        "another path)")
    like = _copy_with(hf_dir, tmp_path / "like")
    assert _one_line(capsys, ["export", ckpt, str(tmp_path), "--like", like, "--force"]) == (
        f"--like {like} is inside HF_DIR {tmp_path}, which is replaced as a whole (give another path)")
    assert os.path.isfile(os.path.join(like, "config.json"))


# ------------------------------------------------------------ 7. bounded before the work; FIFOs never read
def test_sizes_are_bounded_before_the_work_they_imply(tiny, tmp_path, capsys):
    hf_dir, _ = tiny["gqa"]
    config = json.loads(open(os.path.join(hf_dir, "config.json")).read())
    with pytest.raises(HFError, match=r"a model the engine refuses to train \(--layers 10000000 is too large"):
        llama_config_from_hf(config | {"num_hidden_layers": 10**7})  # the config alone: no tensor list built
    bad = _copy_with(hf_dir, tmp_path / "deep", config={"num_hidden_layers": 10**7})
    assert "--layers 10000000 is too large" in _one_line(capsys, ["import", bad, str(tmp_path / "out")])


def test_a_fifo_named_by_a_sharded_index_is_refused_without_reading_it(tiny, tmp_path, capsys):
    hf_dir, ckpt = tiny["gqa"]
    sharded = tmp_path / "sharded"
    export_model(ckpt, str(sharded), like=hf_dir, max_shard_bytes=4096)
    shard = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
    os.unlink(sharded / shard)
    os.mkfifo(sharded / shard)
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(hf_cli.main(["import", str(sharded), str(tmp_path / "o")])),
                              daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():
        for _ in range(100):  # let the blocked reader go, however often it opens the FIFO
            try:
                os.close(os.open(sharded / shard, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            thread.join(0.1)
        pytest.fail("hf import blocked on a FIFO")
    assert outcome == [2]
    assert capsys.readouterr().err == f"error: {sharded / shard} is a FIFO, not a safetensors file\n"
