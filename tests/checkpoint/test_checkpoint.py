"""Checkpoints: exact resume, resharding across grids, atomic saves that keep K, and clear errors
for a missing, truncated, foreign or mismatched checkpoint that every rank reports alike."""
import json
import os

import pytest
import torch

from checkpoint_fakes import sha256_of
from checkpoint_ranks import run_info, save_every_step, straight_then_resumed, train_segment, try_load
from dist_utils import run_ranks
from hybrid_engine import checkpoint
from hybrid_engine.checkpoint import CheckpointError
from hybrid_engine.models import large_linear_model

# Adam, so that optimizer state (exp_avg, exp_avg_sq, step) must round-trip and reshard too.
CFG = dict(dim=32, depth=4, batch_size=32, micro_batches=4, optimizer="adam", lr=1e-3, steps=10)


def test_resume_is_bit_exact_on_cpu_fp32(tmp_path):
    # dp2 x pp2 x mp2: every axis is split, so shards of every kind go through the checkpoint
    out = run_ranks(8, straight_then_resumed, (2, 2, 2), CFG, str(tmp_path), 5, timeout=240)
    for rank, result in enumerate(out):
        assert result["start"] == 5
        assert result["resumed"] == result["straight"], rank  # bit for bit, not approximately
    assert len(set(map(tuple, (r["straight"] for r in out)))) == 1  # the same loss on every rank


def test_reshard_dp2pp2mp2_to_dp1pp4mp2_to_one_rank_continues_the_curve(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    straight = run_ranks(1, train_segment, (1, 1, 1), CFG, None, None, 12)[0]
    first = run_ranks(8, train_segment, (2, 2, 2), CFG, None, a, 4, timeout=240)[0]
    second = run_ranks(8, train_segment, (1, 4, 2), CFG, a, b, 8, timeout=240)[0]
    third = run_ranks(1, train_segment, (1, 1, 1), CFG, b, None, 12)[0]
    assert first + second + third == pytest.approx(straight, rel=1e-5)

    manifest = json.loads((tmp_path / "a" / "step_000004" / "manifest.json").read_text())
    assert manifest["grid"] == {"dp": 2, "pp": 2, "mp": 2, "order": "mp-dp-pp", "world_size": 8}
    full = {k: list(v.shape) for k, v in large_linear_model(32, 4, 0).state_dict().items()}
    assert {k: v["shape"] for k, v in manifest["params"].items()} == full  # whole tensors, not MP shards
    # only the dp 0, mp 0 rank of each stage writes weights: ranks 0 (pp 0) and 4 (pp 1) in order mp-dp-pp
    assert {v["file"] for v in manifest["params"].values()} == {"rank_00000.pt", "rank_00004.pt"}
    assert sorted(manifest["files"]) == [f"rank_{r:05d}.pt" for r in range(8)]


def test_saves_keep_the_newest_k_and_clear_interrupted_ones(tmp_path):
    stale = tmp_path / ".tmp_step_000001_deadbeef"
    stale.mkdir(parents=True)
    (stale / "rank_00000.pt").write_bytes(b"half a shard")
    run_ranks(2, save_every_step, (1, 2, 1), dict(CFG, depth=2), str(tmp_path), 5, 2)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_000004", "step_000005"]
    assert (tmp_path / "latest").read_text().strip() == "step_000005"
    assert checkpoint.open_checkpoint(str(tmp_path)).step == 5


# ------------------------------------------------------------------------------------- errors, one rank each
SMALL = dict(CFG, depth=2, steps=2)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """A pp2 checkpoint of SMALL after 2 steps: rank 0 holds stage 0's weights, rank 1 stage 1's."""
    root = tmp_path_factory.mktemp("ckpt")
    run_ranks(2, train_segment, (1, 2, 1), SMALL, None, str(root), 2)
    return str(root)


def _copy(saved: str, tmp_path) -> str:
    import shutil

    shutil.copytree(saved, tmp_path / "c")
    return str(tmp_path / "c")


def _shapes(dim: int, depth: int) -> dict:
    return {k: tuple(v.shape) for k, v in large_linear_model(dim, depth, 0).state_dict().items()}


def test_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*/nope: no such file or directory"):
        checkpoint.open_checkpoint(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="no manifest.json, no 'latest' and no step_N directory"):
        checkpoint.open_checkpoint(str(tmp_path))


def test_foreign_checkpoints_are_refused(tmp_path):
    torch.save({"0.weight": torch.zeros(2, 2)}, tmp_path / "model.pt")  # somebody else's state_dict
    with pytest.raises(CheckpointError, match="is a file, not a hybrid_engine checkpoint directory"):
        checkpoint.open_checkpoint(str(tmp_path / "model.pt"))
    with pytest.raises(CheckpointError, match="is not a hybrid_engine checkpoint: it has no manifest.json"):
        checkpoint.open_checkpoint(str(tmp_path))
    (tmp_path / "manifest.json").write_text('{"format": "other-trainer/2"}')
    with pytest.raises(CheckpointError, match="format 'other-trainer/2', expected 'hybrid_engine.checkpoint/1'"):
        checkpoint.open_checkpoint(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot be read as JSON"):
        checkpoint.open_checkpoint(str(tmp_path))


def test_truncated_shard_is_named_before_any_collective(saved, tmp_path):
    root = _copy(saved, tmp_path)
    shard = os.path.join(root, "step_000002", "rank_00001.pt")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(CheckpointError, match=r"shard .*step_000002/rank_00001.pt is truncated or damaged"):
        checkpoint.open_checkpoint(root)


def test_unreadable_shard_stops_every_rank_with_the_same_error(saved, tmp_path):
    # A damaged shard whose size still matches the manifest passes the cheap check; only rank 1 reads it
    # (it holds stage 1), yet both ranks must stop with the same message instead of rank 0 waiting for rank 1.
    root = _copy(saved, tmp_path)
    shard = os.path.join(root, "step_000002", "rank_00001.pt")
    size = os.path.getsize(shard)
    with open(shard, "wb") as f:
        f.write(b"\0" * size)
    messages = run_ranks(2, try_load, (1, 2, 1), SMALL, root)
    assert messages[0] == messages[1]
    assert "rank_00001.pt cannot be read" in messages[0] and messages[0].endswith("(rank 1)")


def test_checkpoint_of_another_model_shape_names_both_shapes(saved):
    ckpt = checkpoint.open_checkpoint(saved)
    model = run_info(dict(SMALL, dim=64))["model"]
    with pytest.raises(CheckpointError, match="holds a model of name large_linear_model, dim 32, depth 2; this run "
                                              "builds name large_linear_model, dim 64, depth 2"):
        checkpoint.check_compatible(ckpt, model, _shapes(64, 2), "adam")
    with pytest.raises(CheckpointError, match="saved with --optimizer adam; this run uses sgd"):
        checkpoint.check_compatible(ckpt, run_info(SMALL)["model"], _shapes(32, 2), "sgd")
    checkpoint.check_compatible(ckpt, run_info(SMALL)["model"], _shapes(32, 2), "adam")  # the right one passes


def test_latest_pointing_nowhere_is_an_error(saved, tmp_path):
    root = _copy(saved, tmp_path)
    with open(os.path.join(root, "latest"), "w") as f:
        f.write("step_000099\n")
    with pytest.raises(CheckpointError, match="names 'step_000099', which does not exist"):
        checkpoint.open_checkpoint(root)


# ------------------------------------------------------------------- #15.8 tensors that do not fit the manifest
def _replace_tensor(root: str, shard: str, name: str, tensor, key: str | None = None) -> None:
    """Put `tensor` in place of parameter `name` (or of its optimizer state `key`) in a shard, and record the
    shard's new size and checksum in the manifest, so that only the tensor itself is wrong."""
    step = os.path.join(root, "step_000002")
    state = torch.load(os.path.join(step, shard), weights_only=True)
    if key is None:
        state["weights"][name] = tensor
    else:
        state["optimizer"][name][key] = tensor
    torch.save(state, os.path.join(step, shard))
    manifest = json.loads(open(os.path.join(step, "manifest.json")).read())
    manifest["files"][shard] = os.path.getsize(os.path.join(step, shard))
    manifest["sha256"][shard] = sha256_of(os.path.join(step, shard))
    with open(os.path.join(step, "manifest.json"), "w") as f:
        json.dump(manifest, f)


@pytest.mark.parametrize("tensor, described", [
    (torch.zeros(32), "shape [32] float32"),
    (torch.tensor(0.5), "shape [] float32"),
    (torch.zeros(32, 1), "shape [32, 1] float32"),
    (torch.zeros(32, 32, dtype=torch.float64), "shape [32, 32] float64"),
])
def test_a_weight_of_the_wrong_shape_or_dtype_is_refused(saved, tmp_path, tensor, described):
    # copy_ would broadcast a [32], a scalar or a [32, 1] into a 32 x 32 weight and carry on with other losses
    root = _copy(saved, tmp_path)
    _replace_tensor(root, "rank_00000.pt", "0.weight", tensor)
    message = run_ranks(1, try_load, (1, 1, 1), SMALL, root)[0]
    assert message == (f"checkpoint shard {root}/step_000002/rank_00000.pt holds 0.weight as {described}; the "
                       "manifest says shape [32, 32] float32: damaged, or not written by hybrid_engine")


def test_optimizer_state_of_the_wrong_shape_stops_every_rank_alike(saved, tmp_path):
    # only rank 1 (stage 1) reads rank_00001.pt, yet both ranks stop with its error
    root = _copy(saved, tmp_path)
    _replace_tensor(root, "rank_00001.pt", "2.weight", torch.zeros(32), key="exp_avg")
    messages = run_ranks(2, try_load, (1, 2, 1), SMALL, root)
    assert messages[0] == messages[1] == (
        f"checkpoint shard {root}/step_000002/rank_00001.pt holds optimizer state exp_avg of 2.weight as "
        "shape [32] float32; the manifest says shape [32, 32] float32: damaged, or not written by hybrid_engine "
        "(rank 1)")


# ------------------------------------------------------------------------------------------- damage in place
def flip_tensor_bytes(shard: str, name: str, count: int = 16) -> None:
    """XOR `count` bytes of parameter `name`'s data inside a shard: the file keeps its size, and torch still
    loads it (the zip records are intact); only a checksum can tell."""
    raw = torch.load(shard, weights_only=True)["weights"][name].numpy().tobytes()
    blob = bytearray(open(shard, "rb").read())
    at = blob.find(raw[:64])
    assert at > 0, "the tensor's bytes are stored as they are"
    for i in range(at + 64, at + 64 + count):
        blob[i] ^= 0x5A
    with open(shard, "wb") as f:
        f.write(blob)


def test_a_shard_damaged_in_place_stops_every_rank_naming_the_file(saved, tmp_path):
    # same size, still a valid zip torch loads: only the checksum tells, and every rank must hear of it
    root = _copy(saved, tmp_path)
    shard = os.path.join(root, "step_000002", "rank_00001.pt")
    flip_tensor_bytes(shard, "2.weight")
    messages = run_ranks(2, try_load, (1, 2, 1), SMALL, root)
    assert messages[0] == messages[1] == (f"checkpoint shard {shard} cannot be read (its SHA-256 is not the one its "
                                          "manifest records): damaged since it was written (rank 1)")


def test_the_manifest_records_each_shards_sha256_as_written(saved):
    import hashlib

    ckpt = checkpoint.open_checkpoint(saved)
    assert sorted(ckpt.manifest["sha256"]) == sorted(ckpt.manifest["files"]) == ["rank_00000.pt", "rank_00001.pt"]
    for name, digest in ckpt.manifest["sha256"].items():
        with open(os.path.join(ckpt.path, name), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest
