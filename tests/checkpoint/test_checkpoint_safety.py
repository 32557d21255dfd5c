"""Checkpoint safety, in one process and without a process group:
a run holds its --save directory; nothing outside a checkpoint directory is read, followed or revealed; a
malformed manifest is one clear error; no checkpoint with non-finite state is published; a failed save names
its cause and leaves nothing behind; pruning removes only complete checkpoints that hybrid_engine wrote."""
import errno
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest
import torch

from checkpoint_fakes import OneRankEngine
from hybrid_engine import checkpoint
from hybrid_engine.checkpoint import CheckpointError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = {"model": {"name": "large_linear_model", "dim": 4, "depth": 1, "seed": 0}, "optimizer": "sgd"}


def _engine(value: float = 0.5) -> OneRankEngine:
    return OneRankEngine({"0.weight": torch.full((4, 4), float(value)), "0.bias": torch.full((4,), float(value))},
                         {"0.weight": {"momentum_buffer": torch.zeros(4, 4)}, "0.bias": {}})


def _save(root, step: int, engine=None, keep: int = 3) -> str:
    return checkpoint.save(engine or _engine(step), str(root), step, RUN, keep=keep)


def _latest(root) -> str:
    return (root / "latest").read_text().strip()


# ------------------------------------------------------------------------------------------- #15.3 the lock
def test_a_second_run_cannot_hold_a_save_directory_in_use(tmp_path):
    first = checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1)
    try:
        with pytest.raises(CheckpointError) as err:  # one rank: refused at once, before any collective
            checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1)
        assert str(err.value).startswith(f"--save {tmp_path} is in use by another run "
                                         f"(pid {os.getpid()} on {socket.gethostname()})")
        # a run of several ranks: rank 0 finds out, the others do not try (one flock per file); the ranks learn
        # rank 0's outcome in one collective after the process group exists (agree_on_directory_holds)
        second = checkpoint.hold_directory(str(tmp_path), rank=0, world_size=2)
        assert second.error is not None and "is in use by another run" in second.error
        second.release()  # (no agreement pending for the next test)
        other = checkpoint.hold_directory(str(tmp_path), rank=1, world_size=2)
        assert other.error is None and other.fd is None
    finally:
        first.release()
    checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1).release()  # released: free again


def test_the_lock_dies_with_the_run_that_held_it(tmp_path):
    code = ("import sys, time; from hybrid_engine import checkpoint; "
            f"checkpoint.hold_directory({str(tmp_path)!r}, rank=0, world_size=1); print('held', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=f"in use by another run \\(pid {proc.pid} on "):
            checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1).release()


def test_agreeing_on_the_hold_raises_rank_0s_error_on_one_rank(tmp_path):
    first = checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1)
    try:
        checkpoint.hold_directory(str(tmp_path), rank=0, world_size=2)  # deferred: the error waits for agreement
        with pytest.raises(CheckpointError, match="is in use by another run"):
            checkpoint.agree_on_directory_holds()
    finally:
        first.release()
    checkpoint.agree_on_directory_holds()  # nothing pending: no error


def test_a_symlinked_lock_file_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_text("")
    os.symlink(tmp_path / "elsewhere", tmp_path / ".lock")
    with pytest.raises(CheckpointError, match="cannot hold --save .*lock"):
        checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1)


# -------------------------------------------------------------------------------- #15.4 nothing escapes
@pytest.fixture
def saved(tmp_path):
    root = tmp_path / "ckpt"
    _save(root, 1)
    _save(root, 2)
    return root


def test_latest_naming_a_path_outside_the_directory_is_refused(saved, tmp_path):
    victim = tmp_path / "victim"
    _save(victim, 4)
    for name in ("../victim/step_000004", str(victim / "step_000004"), "step_2", "step_000002/../step_000001"):
        (saved / "latest").write_text(name + "\n")
        with pytest.raises(CheckpointError, match=r"latest does not hold a checkpoint name \(step_NNNNNN\)"):
            checkpoint.open_checkpoint(str(saved))


def test_a_step_directory_symlinked_elsewhere_is_refused(saved, tmp_path):
    victim = tmp_path / "victim"
    _save(victim, 4)
    os.symlink(victim / "step_000004", saved / "step_000004")
    (saved / "latest").write_text("step_000004\n")
    with pytest.raises(CheckpointError, match="step_000004 is a symbolic link, not a checkpoint directory"):
        checkpoint.open_checkpoint(str(saved))
    (saved / "latest").unlink()  # no pointer: the newest complete checkpoint, never through a link
    assert checkpoint.open_checkpoint(str(saved)).path == str(saved / "step_000002")


def test_latest_symlinked_to_a_file_does_not_reveal_it(saved, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2\n")
    (saved / "latest").unlink()
    os.symlink(secret, saved / "latest")
    with pytest.raises(CheckpointError) as err:
        checkpoint.open_checkpoint(str(saved))
    assert "is a symbolic link" in str(err.value) and "hunter2" not in str(err.value)
    (saved / "latest").unlink()
    secret.rename(saved / "latest")  # a regular file with other content: not echoed either
    with pytest.raises(CheckpointError) as err:
        checkpoint.open_checkpoint(str(saved))
    assert "hunter2" not in str(err.value)


def _opens_within(path: str, seconds: float = 10.0):
    """open_checkpoint(path) in a thread: a FIFO or a character device must never block it."""
    outcome = []

    def attempt():
        try:
            outcome.append(checkpoint.open_checkpoint(path))
        except CheckpointError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():  # unblock it: a writer opens the FIFO (the test has failed anyway)
        for fifo in ("latest", "manifest.json"):
            if os.path.exists(os.path.join(path, fifo)) and not os.path.isfile(os.path.join(path, fifo)):
                try:
                    os.close(os.open(os.path.join(path, fifo), os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass
        pytest.fail(f"open_checkpoint({path}) blocked")
    return outcome[0]


def test_latest_that_is_a_fifo_or_a_device_never_blocks(saved):
    (saved / "latest").unlink()
    os.mkfifo(saved / "latest")
    error = _opens_within(str(saved))
    assert isinstance(error, CheckpointError) and "is not a regular file" in str(error)
    (saved / "latest").unlink()
    os.symlink("/dev/zero", saved / "latest")  # (/proc/kmsg in the issue: root only)
    error = _opens_within(str(saved))
    assert isinstance(error, CheckpointError) and "is a symbolic link" in str(error)


def _edit_manifest(ckpt_dir, edit) -> None:
    path = ckpt_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_manifest_shard_names_outside_the_checkpoint_are_refused(saved, tmp_path):
    (tmp_path / "rank_00000.pt").write_bytes((saved / "step_000002" / "rank_00000.pt").read_bytes())
    for name in ("../../rank_00000.pt", "/etc/shadow", "/etc/passwd", "rank_0.pt", "manifest.json"):
        def rename(m):
            m["files"] = {name: 100}
            for p in m["params"].values():
                p["file"] = name

        _edit_manifest(saved / "step_000002", rename)
        with pytest.raises(CheckpointError) as err:
            checkpoint.open_checkpoint(str(saved))
        message = str(err.value)
        assert "is malformed" in message and "shard name" in message, message
        assert "bytes" not in message  # no file's size is revealed


def test_a_shard_or_manifest_that_is_a_symlink_is_refused(saved, tmp_path):
    step = saved / "step_000002"
    elsewhere = tmp_path / "elsewhere.pt"
    (step / "rank_00000.pt").rename(elsewhere)
    os.symlink(elsewhere, step / "rank_00000.pt")
    with pytest.raises(CheckpointError, match="rank_00000.pt is a symbolic link"):
        checkpoint.open_checkpoint(str(saved))
    (step / "manifest.json").rename(tmp_path / "manifest.json")
    os.symlink(tmp_path / "manifest.json", step / "manifest.json")
    with pytest.raises(CheckpointError, match="manifest.json is a symbolic link"):
        checkpoint.open_checkpoint(str(step))


def test_an_oversized_manifest_or_pointer_is_not_read(saved):
    with open(saved / "latest", "ab") as f:
        f.truncate(1 << 20)  # sparse: costs nothing
    with pytest.raises(CheckpointError, match=r"latest is larger than 4096 bytes"):
        checkpoint.open_checkpoint(str(saved))
    with open(saved / "step_000002" / "manifest.json", "ab") as f:
        f.truncate(65 << 20)
    with pytest.raises(CheckpointError, match=r"manifest.json is larger than 67108864 bytes"):
        checkpoint.open_checkpoint(str(saved / "step_000002"))


# ---------------------------------------------------------------------- #16.12 a malformed manifest
@pytest.mark.parametrize("edit, problem", [
    (lambda m: m.pop("files"), "'files' is missing"),
    (lambda m: m.update(files=["rank_00000.pt"]), "'files' is not an object"),
    (lambda m: m.update(files={"rank_00000.pt": "big"}), "the size of rank_00000.pt is not a whole number"),
    (lambda m: m.update(model=["large_linear_model"]), "'model' is not an object"),
    (lambda m: m.update(step="two"), "'step' is not a whole number"),
    (lambda m: m.update(step=-1), "'step' is not a whole number"),
    (lambda m: m.update(optimizer=None), "'optimizer' is not a string"),
    (lambda m: m["grid"].pop("pp"), "'grid' has no whole number 'pp'"),
    (lambda m: m.update(params={}), "'params' is empty"),
    (lambda m: m["params"]["0.weight"].update(shape="4x4"), "parameter 0.weight: 'shape' is not a list"),
    (lambda m: m["params"]["0.weight"].update(dtype="int8"), "parameter 0.weight: dtype 'int8'"),
    (lambda m: m["params"]["0.weight"].update(file="rank_00001.pt"),
     "parameter 0.weight: its shard rank_00001.pt is not among 'files'"),
    (lambda m: m.update(sha256={}), "'sha256' does not name the shards of 'files'"),
    (lambda m: m["sha256"].update({"rank_00000.pt": "0" * 63}), "'sha256' holds a digest that is not 64 hex digits"),
])
def test_a_malformed_manifest_is_one_clear_error(saved, edit, problem):
    _edit_manifest(saved / "step_000002", edit)
    with pytest.raises(CheckpointError) as err:
        checkpoint.open_checkpoint(str(saved))
    assert f"{saved / 'step_000002' / 'manifest.json'} is malformed ({problem}" in str(err.value), str(err.value)


# ------------------------------------------------------------------------- #15.6 non-finite state
@pytest.mark.parametrize("poison, what", [
    (lambda e: e.weights["0.bias"].__setitem__(1, float("nan")), "the weights are not finite (0.bias on rank 0)"),
    (lambda e: e.weights["0.weight"].fill_(float("inf")), "the weights are not finite (0.weight on rank 0)"),
    (lambda e: e.optimizer["0.weight"]["momentum_buffer"].__setitem__((0, 0), float("-inf")),
     "the optimizer state is not finite (0.weight momentum_buffer on rank 0)"),
])
def test_a_checkpoint_with_non_finite_state_is_never_published(saved, poison, what):
    engine = _engine(3.0)
    poison(engine)
    with pytest.raises(CheckpointError) as err:
        _save(saved, 3, engine, keep=1)
    assert str(err.value).startswith(f"checkpoint of step 3 not written: {what}"), str(err.value)
    assert f"{saved / 'latest'} still names step_000002" in str(err.value)
    assert _latest(saved) == "step_000002"  # the good checkpoint stays latest, and nothing is pruned
    assert sorted(os.listdir(saved)) == ["latest", "step_000001", "step_000002"]
    assert checkpoint.open_checkpoint(str(saved)).step == 2


# ----------------------------------------------------------------------------------- #15.9 a full disk
class _FullDisk(io.FileIO):
    """A shard file on a disk that fills up after 1000 bytes, as torch's zip writer meets it."""

    def write(self, data):
        if self.tell() + len(memoryview(data)) > 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def test_a_full_disk_is_named_and_leaves_no_temporary_behind(saved, monkeypatch):
    real_open = open

    def fake_open(path, mode="r", *args, **kwargs):
        return _FullDisk(path, "w") if str(path).endswith(".pt") else real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint.saving, "open", fake_open, raising=False)
    big = OneRankEngine({"0.weight": torch.ones(64, 64), "0.bias": torch.ones(64)})
    for _ in range(2):  # each failed save cleans up after itself
        with pytest.raises(CheckpointError) as err:
            _save(saved, 3, big)
        assert "No space left on device" in str(err.value), str(err.value)
        assert str(err.value).startswith("checkpoint of step 3 not written: cannot write ")
        assert sorted(os.listdir(saved)) == ["latest", "step_000001", "step_000002"]
        assert _latest(saved) == "step_000002"


def test_an_error_without_an_os_cause_keeps_its_first_line(saved, monkeypatch):
    def broken(obj, f):
        raise RuntimeError("\nPytorchStreamWriter failed writing file data/0: file write failed")

    monkeypatch.setattr(checkpoint.saving.torch, "save", broken)
    with pytest.raises(CheckpointError, match="RuntimeError: PytorchStreamWriter failed writing file data/0"):
        _save(saved, 3)
    assert sorted(os.listdir(saved)) == ["latest", "step_000001", "step_000002"]


# ----------------------------------------------------------------------- #15.11 prune only our own
def test_pruning_leaves_what_hybrid_engine_did_not_write(tmp_path):
    (tmp_path / "step_000000").mkdir()
    (tmp_path / "step_000000" / "notes.txt").write_text("my notes")
    (tmp_path / "step_999999").mkdir()  # a stray empty directory with a checkpoint's name
    (tmp_path / ".tmp_step_mine").mkdir()  # not a name a save uses
    for step in range(1, 5):
        _save(tmp_path, step, keep=2)
    assert (tmp_path / "step_000000" / "notes.txt").read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == [".tmp_step_mine", "latest", "step_000000", "step_000003",
                                            "step_000004", "step_999999"]
    (tmp_path / "latest").unlink()  # no pointer: the newest *complete* checkpoint, not the stray directory
    assert checkpoint.latest_path(str(tmp_path)) == str(tmp_path / "step_000004")


def test_a_save_never_moves_aside_a_directory_it_did_not_write(tmp_path):
    # step_N of the same step is moved aside (and later removed) only when it is an earlier save of ours
    (tmp_path / "step_000003").mkdir()
    (tmp_path / "step_000003" / "notes.txt").write_text("my notes")
    _save(tmp_path, 2)
    with pytest.raises(CheckpointError, match="step_000003 exists and is not a hybrid_engine checkpoint"):
        _save(tmp_path, 3)
    assert (tmp_path / "step_000003" / "notes.txt").read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_000002", "step_000003"]
    _save(tmp_path, 2)  # the same step again (a restart): the earlier save of it is replaced
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_000002", "step_000003"]


def test_a_save_directory_that_cannot_hold_a_lock_is_refused_before_training(tmp_path):
    if os.geteuid() == 0:  # root writes into a read-only directory anyway: make the lock's name unusable instead
        (tmp_path / ".lock").mkdir()
        expected = "cannot hold --save .*: the lock file .*/.lock cannot be opened"
    else:
        tmp_path.chmod(0o500)
        expected = r"cannot hold --save .*: the lock file .*/.lock cannot be opened \(Permission denied\)"
    try:
        with pytest.raises(CheckpointError, match=expected):
            checkpoint.hold_directory(str(tmp_path), rank=0, world_size=1)
    finally:
        tmp_path.chmod(0o700)


def test_a_checkpoint_written_before_checksums_still_opens_and_says_so(saved):
    # a manifest of an earlier hybrid_engine has no "sha256": its shards are checked by size, and loaders say so
    _edit_manifest(saved / "step_000002", lambda m: m.pop("sha256"))
    ckpt = checkpoint.open_checkpoint(str(saved))
    assert ckpt.step == 2 and ckpt.checksums is None
    assert checkpoint.newest_intact_before(str(saved / "step_000003"), 3) == str(saved / "step_000001")


class _FullDiskNow(_FullDisk):
    """A file on a disk with no space left at all."""

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_pointing_latest_leaves_nothing_and_says_what_latest_is(tmp_path, monkeypatch):
    real_open = open

    def fake_open(path, mode="r", *args, **kwargs):
        if os.path.basename(str(path)).startswith(".latest."):
            return _FullDiskNow(path, "w")  # created, then nothing fits
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint.saving, "open", fake_open, raising=False)
    with pytest.raises(CheckpointError) as err:  # the first checkpoint: there is no latest to speak of
        _save(tmp_path, 1)
    assert str(err.value).endswith(f"No space left on device; {tmp_path} holds no earlier checkpoint"), str(err.value)
    assert os.listdir(tmp_path) == []  # no zero-byte .latest.*, and no step_000001 that latest does not name
    monkeypatch.undo()
    _save(tmp_path, 1)
    monkeypatch.setattr(checkpoint.saving, "open", fake_open, raising=False)
    with pytest.raises(CheckpointError) as err:
        _save(tmp_path, 2)
    assert str(err.value).endswith(f"No space left on device; {tmp_path / 'latest'} still names step_000001")
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_000001"]


def test_the_search_for_an_intact_older_checkpoint_is_bounded_in_time(saved):
    # rank 0 hashes while the other ranks wait in a collective: past the deadline it stops, and the caller names
    # the newest complete one instead
    with pytest.raises(checkpoint.OutOfTime):
        checkpoint.newest_intact_before(str(saved / "step_000003"), 3, deadline=0.0)
    assert checkpoint.newest_complete_before(str(saved / "step_000003"), 3) == str(saved / "step_000002")
