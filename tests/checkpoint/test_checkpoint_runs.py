"""Checkpoints through the real driver under torchrun, 2 CPU ranks, the issue's model:
two runs never share a --save directory; a diverged update never replaces the good checkpoint; a disk that
refuses a shard names the cause and leaves nothing behind. Each failure is one line on every rank, exit 2."""
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import torch

from checkpoint_fakes import sha256_of, shards_match_their_checksums
from launch_utils import DRIVER, REPO, free_port, torchrun

MODEL = ("--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "2", "--quiet")
ENV = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")


def _one_rank(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DRIVER), *MODEL, *args], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=90, **kwargs)


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A --save directory after two steps of one rank, as _one_rank writes it: the start of two tests, each of
    which works on its own copy."""
    root = tmp_path_factory.mktemp("two_steps") / "ckpt"
    assert _one_rank("--steps", "2", "--save", str(root)).returncode == 0
    return root


def _error_lines(run: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in run.stderr.splitlines() if ln.startswith("hybrid_engine:")]


def _every_rank_says(run: subprocess.CompletedProcess, expected: str) -> str:
    """Every rank stops with the same error, and it is said once (rank 0 speaks for all: hybrid_engine/train/cli.py)."""
    lines = _error_lines(run)
    assert run.returncode != 0
    assert len(lines) == 1, run.stderr
    assert all(ln.startswith("hybrid_engine: error: ") and expected in ln for ln in lines), lines
    assert "exitcode  : 2" in run.stderr  # torchrun's report of the first rank to leave
    assert 'hybrid_engine.py", line' not in run.stderr and not any(  # ours: no traceback
        f'{name}.py", line' in run.stderr for name in ("checkpoint", "checkpoint_files", "checkpoint_lock",
                                                         "checkpoint_agree", "cli", "trainer"))
    return lines[0]


def test_a_second_run_on_a_save_directory_in_use_stops_before_training(tmp_path):
    root = tmp_path / "ckpt"
    first = subprocess.Popen([sys.executable, str(DRIVER), *MODEL, "--steps", "1000000", "--save", str(root)],
                             cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline()  # the grid table: the first run is past its checks and holds DIR
        first.send_signal(signal.SIGSTOP)  # still holding it, without spending the CPU the second run needs
        second = torchrun(2, "--pp", "2", *MODEL, "--steps", "2", "--save", str(root), timeout=90)
        line = _every_rank_says(second, f"--save {root} is in use by another run (pid {first.pid} on "
                                        f"{socket.gethostname()})")
        assert "step " not in second.stdout  # stopped before training
        assert sorted(os.listdir(root)) == [".lock"]
        assert line.endswith("two runs must not share a checkpoint directory (wait for it to end, or choose "
                             "another directory)")
    finally:
        first.kill()
        first.wait()
    # the lock dies with the run that held it: the directory is free at once, nothing stale to clean up
    third = _one_rank("--steps", "2", "--save", str(root))
    assert third.returncode == 0, third.stderr
    assert (root / "latest").read_text().strip() == "step_000002"


def _blow_up_last_layer(root) -> None:
    """Make the last weight of step_000002 large (1e6, finite): the next update at --lr 1e38 overflows."""
    step = root / "step_000002"
    state = torch.load(step / "rank_00000.pt", weights_only=True)
    state["weights"]["6.weight"].fill_(1e6)
    torch.save(state, step / "rank_00000.pt")
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"]["rank_00000.pt"] = (step / "rank_00000.pt").stat().st_size
    manifest["sha256"]["rank_00000.pt"] = sha256_of(step / "rank_00000.pt")
    (step / "manifest.json").write_text(json.dumps(manifest))


def test_a_diverged_update_never_replaces_the_good_checkpoint(tmp_path, two_steps):
    root = shutil.copytree(two_steps, tmp_path / "ckpt")
    _blow_up_last_layer(root)
    # step 2's loss is finite, its update makes the weights infinite; saving step 3 must not publish them
    run = torchrun(2, "--pp", "2", *MODEL, "--steps", "4", "--save", str(root), "--save-every", "1",
                   "--keep-checkpoints", "1", "--resume", "--lr", "1e38", timeout=90)
    _every_rank_says(run, "checkpoint of step 3 not written: the weights are not finite (")
    assert _error_lines(run)[0].endswith(f"{root / 'latest'} still names step_000002")
    assert (root / "latest").read_text().strip() == "step_000002"
    assert sorted(os.listdir(root)) == [".lock", "latest", "model.toml", "step_000002"]  # nothing pruned, nothing left over


def _file_size_limit(limit: int):
    def apply():  # in the child, before exec: writes past `limit` bytes fail with EFBIG instead of killing it
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_refused_write_is_named_and_leaves_the_previous_checkpoint(tmp_path, two_steps):
    # a disk that takes no more than 4 KiB per file (RLIMIT_FSIZE): torch's zip writer fails as on a full disk
    # (a RuntimeError whose context is the OSError); the line names the OS error, the temporary is removed
    root = shutil.copytree(two_steps, tmp_path / "ckpt")
    for _ in range(2):  # each failed save cleans up after itself
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
               str(DRIVER), "--pp", "2", *MODEL, "--steps", "4", "--save", str(root), "--resume"]
        run = subprocess.run(cmd, cwd=REPO, env=dict(ENV, GLOO_SOCKET_IFNAME="lo"), capture_output=True,
                             text=True, timeout=90, preexec_fn=_file_size_limit(4096))
        line = _every_rank_says(run, "checkpoint of step 4 not written: cannot write ")
        assert "rank_0000" in line and line.endswith(f": File too large; {root / 'latest'} still names step_000002")
        assert sorted(os.listdir(root)) == [".lock", "latest", "model.toml", "step_000002"]



def test_a_damaged_latest_names_the_intact_older_checkpoint_and_load_continues_from_it(tmp_path):
    from test_checkpoint import flip_tensor_bytes

    root = tmp_path / "ckpt"
    assert _one_rank("--steps", "4", "--save-every", "2", "--save", str(root)).returncode == 0
    shard = root / "step_000004" / "rank_00000.pt"
    flip_tensor_bytes(str(shard), "0.weight")  # same size, still a zip torch reads
    run = _one_rank("--steps", "6", "--save", str(root), "--resume")
    assert run.returncode == 2 and _error_lines(run) == [
        f"hybrid_engine: error: checkpoint shard {shard} cannot be read (its SHA-256 is not the one its manifest "
        f"records): damaged since it was written; the newest intact older checkpoint is {root / 'step_000002'}: "
        f"continue from it with --resume --load {root / 'step_000002'}"], run.stderr
    # what the line says works: --load names the checkpoint to continue from inside the same --save
    run = _one_rank("--steps", "6", "--save-every", "2", "--save", str(root), "--resume", "--load",
                    str(root / "step_000002"))
    assert run.returncode == 0, run.stderr
    assert f"resumed from {root / 'step_000002'} at step 2" in run.stdout
    assert (root / "latest").read_text().strip() == "step_000006"
    assert sorted(os.listdir(root)) == [".lock", "latest", "model.toml", "step_000002", "step_000004", "step_000006"]
    assert shards_match_their_checksums(root / "step_000004")  # the damaged one was saved again by this run


def test_a_diverged_update_never_becomes_latest_and_resume_with_a_lower_lr_trains_on(tmp_path):
    # --lr 1e30: step 2's loss is finite, the update it makes is not; the checkpoint of that state (step 3) is
    # written, but never published: step 3's loss is NaN. A spike (--lr 100) stops the same way.
    root = tmp_path / "ckpt"
    assert _one_rank("--steps", "2", "--save-every", "1", "--save", str(root), "--lr", "0.01").returncode == 0
    advice = (f"--resume with a lower --lr continues from {root / 'step_000002'}, the last checkpoint that trained "
              "on with a finite loss and no spike")
    run = _one_rank("--steps", "6", "--save-every", "1", "--save", str(root), "--resume", "--lr", "1e30")
    assert run.returncode == 1 and _error_lines(run) == [
        f"hybrid_engine: error: loss is NaN at step 3: training stopped (an update diverged); {advice}"], run.stderr
    assert sorted(os.listdir(root)) == [".lock", "latest", "model.toml", "step_000001", "step_000002"]
    run = _one_rank("--steps", "6", "--save-every", "1", "--save", str(root), "--resume", "--lr", "100")
    lines = _error_lines(run)
    assert run.returncode == 1 and len(lines) == 1, run.stderr
    assert lines[0].startswith("hybrid_engine: error: loss ") and " at step 3 is more than 10x the largest of the " \
        "1 before it (0.270601): a spike: training stopped (an update diverged); " in lines[0], lines[0]
    assert lines[0].endswith(f"{advice} (--spike-factor 0 trains through spikes)"), lines[0]
    assert (root / "latest").read_text().strip() == "step_000002"
    run = _one_rank("--steps", "6", "--save", str(root), "--resume", "--lr", "0.01")  # what the line says works
    assert run.returncode == 0, run.stderr
    assert (root / "latest").read_text().strip() == "step_000006"
