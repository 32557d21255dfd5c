"""Bad input through the real driver under torchrun: every rank stops,
the mistake every rank finds alike is printed once (one clear line), the run exits non-zero well before a
collective could time out, and our script prints no traceback. Two ranks wherever the mistake does not need
more (each launch costs seconds on a small CI machine)."""
import os
import shutil
import subprocess
import sys

import pytest

from checkpoint_fakes import sha256_of
from launch_utils import DRIVER, REPO, torchrun

SMALL = ("--dim", "32", "--depth", "2", "--batch-size", "8", "--micro-batches", "2", "--optimizer", "adam",
         "--steps", "4", "--quiet")


def fails_on_every_rank(args, expected: str, nproc: int = 2, extra_env: dict | None = None, code: int = 2) -> str:
    # the timeout only catches a hang: below the driver's default --comm-timeout (60 s), so a rank left waiting
    # in a collective for a peer that already gave up fails the test
    run = torchrun(nproc, *args, timeout=50, extra_env=extra_env)
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("hybrid_engine: error:")]
    assert run.returncode != 0
    assert len(lines) == 1, run.stderr  # every rank found it: rank 0 says it once, the others leave silently
    assert all(expected in ln for ln in lines), lines
    assert f"exitcode  : {code}" in run.stderr  # torchrun's report of the first rank to leave
    assert 'hybrid_engine.py", line' not in run.stderr and "checkpoint.py\", line" not in run.stderr
    assert not any(f'{name}.py", line' in run.stderr for name in ("checkpoint_files", "checkpoint_lock",
                                                                  "checkpoint_agree"))  # split out of checkpoint.py
    return lines[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """A checkpoint of the SMALL model written by one rank of the real driver."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, str(DRIVER), *SMALL, "--steps", "2", "--save", str(root)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return str(root)


def test_grid_not_matching_world_size():
    fails_on_every_rank(("--dp", "2", "--pp", "2"), "grid dp x pp x mp = 2 x 2 x 1 = 4 != world size 2")


def test_a_size_below_one():
    fails_on_every_rank(("--pp", "0"), "--pp must be >= 1, got 0")


def test_depth_below_pipeline_stages():
    fails_on_every_rank(("--pp", "2", "--depth", "1"), "--depth 1 is less than pp x virtual stages = 2 x 1 = 2")


def test_batch_not_divisible_by_dp_times_micro_batches():
    fails_on_every_rank(("--dp", "2", "--batch-size", "6", "--micro-batches", "2"),
                        "--batch-size 6 is not divisible by dp x micro-batches = 2 x 2 = 4")


def test_dim_not_divisible_by_mp():
    fails_on_every_rank(("--mp", "2", "--dim", "33"), "--dim 33 is not divisible by --mp 2")


def test_unknown_schedule():
    fails_on_every_rank(("--pp", "2", "--schedule", "zigzag"), "argument --schedule: invalid choice: 'zigzag'")


def test_interleaved_with_one_virtual_stage():
    fails_on_every_rank(("--pp", "2", "--schedule", "interleaved", "--virtual-stages", "1"),
                        "the interleaved schedule needs --virtual-stages >= 2")


def test_dualpipev_with_fewer_micro_batches_than_stages():
    fails_on_every_rank(("--pp", "2", "--schedule", "dualpipev", "--micro-batches", "2"),
                        "dualpipev needs at least 2 x pp micro-batches (got micro-batches=2, pp=2)")


def test_lookahead_with_a_schedule_that_has_none():
    fails_on_every_rank(("--pp", "2", "--schedule", "gpipe", "--lookahead", "1"),
                        "--lookahead applies to --schedule 1f1b and zb1 only (got gpipe)")


def test_fp16_without_a_gpu():
    fails_on_every_rank(("--pp", "2", "--amp", "fp16"), "--amp fp16 needs CUDA GPUs")


def test_missing_checkpoint(tmp_path):
    fails_on_every_rank(("--pp", "2", *SMALL, "--load", str(tmp_path / "nowhere")),
                        f"no checkpoint at {tmp_path / 'nowhere'}: no such file or directory")


def test_truncated_checkpoint(saved, tmp_path):
    root = shutil.copytree(saved, tmp_path / "ckpt")
    shard = root / "step_000002" / "rank_00000.pt"
    shard.write_bytes(shard.read_bytes()[:1000])
    fails_on_every_rank(("--pp", "2", *SMALL, "--load", str(root)),
                        f"checkpoint shard {shard} is truncated or damaged: 1000 bytes")


def test_foreign_checkpoint(tmp_path):
    import torch

    torch.save({"0.weight": torch.zeros(32, 32)}, tmp_path / "model.pt")
    fails_on_every_rank(("--pp", "2", *SMALL, "--load", str(tmp_path)),
                        f"{tmp_path} is not a hybrid_engine checkpoint: it has no manifest.json")


def test_checkpoint_of_a_different_model_shape(saved):
    line = fails_on_every_rank(("--pp", "2", *SMALL, "--dim", "64", "--load", saved),
                               "holds a model of name large_linear_model, dim 32, depth 2; this run builds "
                               "name large_linear_model, dim 64, depth 2")
    assert saved in line


def test_nan_loss_stops_every_rank_naming_the_step():
    fails_on_every_rank(("--pp", "2", *SMALL), "loss is NaN at step 2: training stopped",
                        extra_env={"HYBRID_ENGINE_TEST_NAN_AT_STEP": "2"}, code=1)


def test_checkpoint_path_escaping_the_save_directory(saved, tmp_path):
    root = shutil.copytree(saved, tmp_path / "ckpt")
    shutil.copytree(saved, tmp_path / "victim")  # another run's weights: never loaded through `latest`
    (root / "latest").write_text("../victim/step_000002\n")
    fails_on_every_rank(("--pp", "2", *SMALL, "--load", str(root)),
                        f"{root / 'latest'} does not hold a checkpoint name (step_NNNNNN)")


def test_checkpoint_manifest_malformed(saved, tmp_path):
    import json

    root = shutil.copytree(saved, tmp_path / "ckpt")
    manifest = root / "step_000002" / "manifest.json"
    manifest.write_text(json.dumps({k: v for k, v in json.loads(manifest.read_text()).items() if k != "files"}))
    fails_on_every_rank(("--pp", "2", *SMALL, "--load", str(root)),
                        f"{manifest} is malformed ('files' is missing): damaged, or not written by hybrid_engine")


def test_checkpoint_tensor_of_the_wrong_shape(saved, tmp_path):
    import json

    import torch

    root = shutil.copytree(saved, tmp_path / "ckpt")
    shard, manifest = root / "step_000002" / "rank_00000.pt", root / "step_000002" / "manifest.json"
    state = torch.load(shard, weights_only=True)
    state["weights"]["0.weight"] = torch.zeros(32)  # copy_ would broadcast it into the 32 x 32 weight
    torch.save(state, shard)
    record = json.loads(manifest.read_text())
    record["files"]["rank_00000.pt"] = shard.stat().st_size
    record["sha256"]["rank_00000.pt"] = sha256_of(shard)  # only the tensor is wrong
    manifest.write_text(json.dumps(record))
    fails_on_every_rank(("--pp", "2", *SMALL, "--load", str(root)),
                        f"checkpoint shard {shard} holds 0.weight as shape [32] float32; the manifest says shape "
                        "[32, 32] float32")


def test_a_metrics_file_that_cannot_be_written_is_named_on_every_rank():
    # a full disk, as /dev/full is: the OSError named no file, and only rank 0 (the one writing) knew of it
    fails_on_every_rank(("--pp", "2", *SMALL, "--metrics", "/dev/full"),
                        "hybrid_engine: error: cannot write --metrics /dev/full: No space left on device")


def test_a_config_that_is_not_utf8_is_one_line_on_every_rank(tmp_path):
    # a rank that fails before the rendezvous must not mistake the store it has not asked yet for a lost launcher
    path = tmp_path / "run.toml"
    path.write_bytes(b"[model]\ndim = \xff\n")
    fails_on_every_rank(("--config", str(path)), f"hybrid_engine: error: --config {path} is not UTF-8 text")


def test_a_zero_shard_size_that_does_not_divide_the_data_parallel_ranks():
    fails_on_every_rank(("--dp", "2", "--zero", "2", "--zero-shard-size", "3", *SMALL),
                        "--zero-shard-size 3 does not divide the 2 data-parallel ranks (dp x cp)")
