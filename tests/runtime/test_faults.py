"""Faults with real processes: a rank SIGKILLed mid-run ends every other rank within 60 s
with a line naming it (under torchrun, and without a launcher that tears the others down); torchrun
--max-restarts with --resume finishes from the last checkpoint with the uninterrupted losses; a crash while
saving leaves the previous checkpoint loadable. The test hooks are described in hybrid_engine/runtime/faults.py."""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from checkpoint_ranks import train_segment
from dist_utils import run_ranks
from hybrid_engine.metrics import records
from launch_utils import DRIVER, REPO, free_port, torchrun

MODEL = ("--dim", "32", "--batch-size", "8", "--micro-batches", "2", "--optimizer", "adam", "--lr", "1e-3")
CFG = dict(dim=32, depth=2, batch_size=8, micro_batches=2, optimizer="adam", lr=1e-3)
LOST = "lost rank 1 (no heartbeat and no exit note"


def _env(**hooks) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="")
    env.update({f"HYBRID_ENGINE_TEST_{k}": str(v) for k, v in hooks.items()})
    return env


def _plain_ranks(world: int, args: tuple, env: dict) -> list[subprocess.Popen]:
    """One driver process per rank, no launcher: nobody tears the survivors down but themselves."""
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    return [subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=REPO, text=True,
                             env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(world)]


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=timeout)
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def test_sigkilled_rank_under_torchrun_ends_every_other_rank_naming_it():
    # the timeout is the claim: every survivor has ended within 60 s (a hang raises TimeoutExpired)
    run = torchrun(3, "--pp", "3", "--depth", "3", *MODEL, "--steps", "8", timeout=60,
                   extra_env={"HYBRID_ENGINE_TEST_KILL_AT_STEP": "3", "HYBRID_ENGINE_TEST_KILL_RANK": "1"})
    assert run.returncode != 0
    for rank in (0, 2):
        lines = [ln for ln in run.stderr.splitlines() if ln.startswith(f"hybrid_engine: rank {rank}:")]
        assert len(lines) == 1 and LOST in lines[0], run.stderr
    # torchrun's own report names the dead worker too
    assert re.search(r"rank\s+: 1 \(local_rank: 1\)\s+exitcode\s+: -9", run.stderr), run.stderr
    assert "step    2" in run.stdout and "step    3" not in run.stdout


def test_sigkilled_rank_without_a_launcher_ends_the_others_within_the_timeout():
    procs = _plain_ranks(3, ("--pp", "3", "--depth", "3", *MODEL, "--steps", "8", "--comm-timeout", "10"),
                         _env(KILL_AT_STEP=3, KILL_RANK=1))
    results = _finish(procs, timeout=60)  # a rank still running after 60 s hangs: TimeoutExpired fails the test
    assert results[1][0] == -signal.SIGKILL
    for rank in (0, 2):
        code, err = results[rank]
        assert code == 1, err
        lines = [ln for ln in err.splitlines() if ln.startswith("hybrid_engine:")]
        assert len(lines) == 1 and lines[0].startswith(f"hybrid_engine: rank {rank}: {LOST}"), err


def test_sigterm_reaches_a_rank_blocked_in_a_collective():
    # rank 1 is frozen (SIGSTOP), so rank 0 waits in a collective that neither completes nor fails; the
    # SIGTERM torchrun would send must still produce the line, at once, not after --comm-timeout
    procs = _plain_ranks(2, ("--pp", "2", "--depth", "2", *MODEL, "--steps", "100000", "--comm-timeout", "120"), _env())
    try:
        assert "step " in _read_until(procs[0], "step ", timeout=60)
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(1.0)
        procs[0].send_signal(signal.SIGTERM)
        _, err = procs[0].communicate(timeout=10)  # at once, not after --comm-timeout (120 s): else TimeoutExpired
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode == 143
    assert f"hybrid_engine: rank 0: stopped: {LOST}" in err and "; received SIGTERM" in err, err


def _read_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while marker not in seen and time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stdout.readline()
    return seen


def _losses(metrics_file) -> dict[int, list[float]]:
    by_step: dict[int, list[float]] = {}
    for record in records.steps(records.read(metrics_file)):
        by_step.setdefault(record["step"], []).append(record["loss"])
    return by_step


def test_torchrun_max_restarts_with_resume_finishes_with_the_uninterrupted_losses(tmp_path):
    reference = run_ranks(2, train_segment, (1, 2, 1), CFG, None, None, 8)[0]
    metrics = tmp_path / "metrics.jsonl"
    run = torchrun(2, "--pp", "2", "--depth", "2", *MODEL, "--steps", "8", "--save", str(tmp_path / "ckpt"),
                   "--save-every", "2", "--resume", "--metrics", str(metrics), timeout=120,
                   torchrun_args=("--max-restarts", "1"),
                   extra_env={"HYBRID_ENGINE_TEST_KILL_AT_STEP": "5", "HYBRID_ENGINE_TEST_KILL_RANK": "1"})
    assert run.returncode == 0, run.stderr
    assert f"resumed from {tmp_path / 'ckpt' / 'step_000004'} at step 4" in run.stdout
    losses = _losses(metrics)
    assert len(losses[4]) == 2 and losses[4][0] == losses[4][1]  # step 4 ran twice: the same loss, bit for bit
    assert [losses[s][-1] for s in range(8)] == reference
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step_000008"


def test_crash_during_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    root = tmp_path / "ckpt"
    run = torchrun(2, "--pp", "2", "--depth", "2", *MODEL, "--steps", "6", "--save", str(root),
                   "--save-every", "2", timeout=90,
                   extra_env={"HYBRID_ENGINE_TEST_CRASH_IN_SAVE": "4", "HYBRID_ENGINE_TEST_KILL_RANK": "1"})
    assert run.returncode != 0
    assert (root / "latest").read_text().strip() == "step_000002"
    partial = [p for p in root.iterdir() if p.name.startswith(".tmp_step_000004_")]
    assert len(partial) == 1 and not (partial[0] / "manifest.json").exists()
    assert not (root / "step_000004").exists()

    # the previous checkpoint loads (here on one rank: pp2 -> 1) and training completes
    resumed = subprocess.run([sys.executable, str(DRIVER), "--depth", "2", *MODEL, "--steps", "6",
                              "--save", str(root), "--save-every", "2", "--resume"], cwd=REPO, env=_env(), capture_output=True,
                             text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {root / 'step_000002'} at step 2" in resumed.stdout
    assert sorted(p.name for p in root.iterdir()) == [".lock", "latest", "model.toml", "step_000002", "step_000004", "step_000006"]


# --- hangs and orphans: bounded by a small --comm-timeout, every process killed in a finally ---

HANG_MODEL = ("--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "2", "--steps", "100000")
# --comm-timeout of the tests below: what a survivor waits for a frozen peer before it looks, so the frozen-rank
# tests each wait that long. 4 s is well above a collective's wait for a live peer of these tiny models (the ranks
# start together and do the same work); they passed with 12 busy loops beside them on 2 cores
TIMEOUT = 4
SLACK = 20  # a loaded CI machine: the bound only catches a hang, it is not a timing
LOST_FROZEN = "lost rank 1 (no heartbeat and no exit note: killed, crashed, out of memory or frozen)"


def _children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is `pid`."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                kids.append(int(entry))
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rank_of(pid: int) -> int:
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return int(env[b"RANK"])


def _torchrun_popen(nproc: int, args: tuple, tmp_path, launcher: str = "torch.distributed.run",
                    **hooks) -> subprocess.Popen:
    """torchrun (or `launcher`, a module taking its arguments) in the background, its (and its workers')
    stdout/stderr in tmp_path/out and tmp_path/err."""
    cmd = [sys.executable, "-m", launcher, f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
           str(DRIVER), *args]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        return subprocess.Popen(cmd, cwd=REPO, env=_env(**hooks), stdout=out, stderr=err)


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _workers(launcher: subprocess.Popen, nproc: int, tmp_path) -> dict[int, int]:
    """rank -> pid of torchrun's workers, once they are training (step 2 printed)."""
    assert _wait_for(lambda: "step    2" in (tmp_path / "out").read_text() or launcher.poll() is not None, 90), \
        (tmp_path / "err").read_text()
    kids = _children(launcher.pid)
    assert len(kids) == nproc, (kids, (tmp_path / "err").read_text())
    return {_rank_of(pid): pid for pid in kids}


def _kill_all(pids) -> None:
    for pid in pids:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def _rank_lines(err: str, rank: int) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"hybrid_engine: rank {rank}:")]


@pytest.mark.parametrize("launcher", ["torch.distributed.run", "hybrid_engine.launch"])
def test_frozen_rank_under_a_launcher_ends_the_whole_job_naming_it(tmp_path, launcher):
    # the grid's groups (here the DP all-reduce) would otherwise take torch's default 30-minute timeout. The job, the
    # frozen rank included, must end within the timeout and a few seconds: torchrun's SIGTERM does not move a
    # stopped process, and its SIGKILL comes 30 s later
    proc = _torchrun_popen(2, (*HANG_MODEL, "--comm-timeout", str(TIMEOUT)), tmp_path, launcher)
    workers = {}
    try:
        workers = _workers(proc, 2, tmp_path)
        os.kill(workers[1], signal.SIGSTOP)
        assert _wait_for(lambda: not _alive(workers[0]), TIMEOUT + SLACK), "rank 0 still running: hung"
        assert _wait_for(lambda: proc.poll() is not None, TIMEOUT + SLACK), "the job still running"
        assert not _alive(workers[1]), "the frozen rank was left behind"
    finally:
        _kill_all([*workers.values(), proc.pid])
        proc.wait(timeout=30)
    assert proc.returncode != 0
    lines = _rank_lines((tmp_path / "err").read_text(), 0)
    assert len(lines) == 1 and LOST_FROZEN in lines[0], (tmp_path / "err").read_text()
    assert f"; ended frozen rank 1 (pid {workers[1]}, stopped on this machine) with SIGKILL" in lines[0], lines[0]


def test_frozen_rank_without_a_launcher_ends_the_others_naming_it():
    # the same with no torchrun to tear anything down
    procs = _plain_ranks(2, (*HANG_MODEL, "--comm-timeout", str(TIMEOUT)), _env())
    try:
        assert "step    2" in _read_until(procs[0], "step    2", timeout=90)
        os.kill(procs[1].pid, signal.SIGSTOP)
        _, err = procs[0].communicate(timeout=TIMEOUT + SLACK)
        frozen_ended = procs[1].wait(timeout=5) == -signal.SIGKILL  # by rank 0, which found it stopped
    finally:
        _kill_all(p.pid for p in procs)
        for p in procs:
            p.wait()
    assert procs[0].returncode == 1, err
    lines = _rank_lines(err, 0)
    assert len(lines) == 1 and lines[0].startswith(f"hybrid_engine: rank 0: {LOST_FROZEN}"), err
    assert frozen_ended and f"; ended frozen rank 1 (pid {procs[1].pid}, stopped on this machine) with SIGKILL; " \
        in lines[0], err


@pytest.mark.parametrize("grid", [(), ("--pp", "2")])  # dp 2; pp 2, whose stalled step is also named
def test_frozen_rank_0_without_a_launcher_ends_the_others_naming_the_store(grid):
    # rank 0 serves the store, so the store freezes too; no survivor may wait on it (a TCPStore call
    # on a server that never answers blocks whatever its timeout)
    procs = _plain_ranks(2, (*HANG_MODEL, *grid, "--comm-timeout", str(TIMEOUT)), _env())
    try:
        assert "step    2" in _read_until(procs[0], "step    2", timeout=90)
        os.kill(procs[0].pid, signal.SIGSTOP)
        _, err = procs[1].communicate(timeout=TIMEOUT + SLACK)
        frozen_ended = procs[0].wait(timeout=5) == -signal.SIGKILL
    finally:
        _kill_all(p.pid for p in procs)
        for p in procs:
            p.wait()
    assert procs[1].returncode == 1, err
    lines = _rank_lines(err, 1)
    assert len(lines) == 1 and lines[0].startswith("hybrid_engine: rank 1: the rendezvous store is unreachable "
                                                   "(without torchrun it lives in rank 0, so rank 0 was probably "
                                                   "lost); ended frozen rank 0"), err
    assert frozen_ended
    # and nothing after it: no client of the dead store, no C++ stack of c10d's from the connections it reset
    assert "frame #" not in err and "[c10d]" not in err, err


def test_killed_torchrun_leaves_no_rank_running(tmp_path):
    # SIGKILL of the launcher alone (not its workers); they must notice and stop
    root = tmp_path / "ckpt"
    launcher = _torchrun_popen(2, ("--pp", "2", *HANG_MODEL, "--comm-timeout", str(TIMEOUT), "--save", str(root),
                                   "--save-every", "1"), tmp_path)
    workers = {}
    try:
        workers = _workers(launcher, 2, tmp_path)
        launcher.kill()
        launcher.wait()
        gone = _wait_for(lambda: not any(_alive(pid) for pid in workers.values()), TIMEOUT + SLACK)
        running = [rank for rank, pid in workers.items() if _alive(pid)]
    finally:
        _kill_all(workers.values())
    assert gone, f"ranks {running} still running after torchrun was killed"
    err = (tmp_path / "err").read_text()
    for rank in workers:  # the line of its launcher watch, or of its own error when a peer's exit came first
        lines = _rank_lines(err, rank)
        assert len(lines) == 1 and lines[0].startswith(f"hybrid_engine: rank {rank}: the launcher is gone (torchrun "
                                                       "was killed)"), err
    latest = (root / "latest").read_text().strip()  # the atomic save: latest names a complete checkpoint
    assert (root / latest / "manifest.json").is_file()


def test_silent_listener_on_master_port_ends_both_ranks_with_one_line_each():
    # something holds MASTER_PORT, accepts connections and never answers
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2")
        # nothing there ever answers, so any --comm-timeout ends the wait the same way: a short one
        procs = [subprocess.Popen([sys.executable, str(DRIVER), *HANG_MODEL, "--comm-timeout", "2"], cwd=REPO,
                                  text=True, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
        results = _finish(procs, timeout=2 + 40)
    for rank, (code, err) in enumerate(results):
        assert code == 1, err
        lines = [ln for ln in err.splitlines() if ln.startswith("hybrid_engine:")]
        assert len(lines) == 1 and "rendezvous store" in lines[0] and "MASTER_PORT" in lines[0], err
        assert "Traceback" not in err, err
    assert f"127.0.0.1:{port}" in results[1][1]


def test_sigterm_to_one_rank_is_named_by_the_rank_and_by_the_survivor():
    # nobody but the test sent the SIGTERM; the rank says what it got, the survivor names it
    procs = _plain_ranks(2, ("--pp", "2", *HANG_MODEL, "--comm-timeout", str(TIMEOUT)), _env())
    try:
        assert "step    2" in _read_until(procs[0], "step    2", timeout=90)
        procs[1].send_signal(signal.SIGTERM)
        results = _finish(procs, timeout=TIMEOUT + SLACK)
    finally:
        _kill_all(p.pid for p in procs)
    (code0, err0), (code1, err1) = results
    lines1 = _rank_lines(err1, 1)  # it may go on to say where its step was waiting (runtime/hang_report.py)
    assert code1 == 143 and len(lines1) == 1, err1
    assert re.fullmatch(r"hybrid_engine: rank 1: stopped: received SIGTERM( while (stalled at|in) stage 1, action .*)?", lines1[0])
    assert code0 == 1, err0
    lines = _rank_lines(err0, 0)
    assert len(lines) == 1 and lines[0].startswith("hybrid_engine: rank 0: rank 1 stopped by SIGTERM; "), err0


@pytest.fixture(autouse=True)
def _no_stray_hooks(monkeypatch):
    for name in list(os.environ):
        if name.startswith("HYBRID_ENGINE_TEST_"):
            monkeypatch.delenv(name)
