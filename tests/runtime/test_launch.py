"""`python -m hybrid_engine.launch`: torchrun's arguments and agent, but the shell sees
the ranks' own exit code and lines, and Ctrl-C under it leaves no launcher traceback."""
import os
import re
import signal
import subprocess
import sys

from launch_utils import DRIVER, REPO, free_port

SMALL = ("--dim", "32", "--depth", "2", "--batch-size", "8", "--micro-batches", "2")


def _launch_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "hybrid_engine.launch", f"--nproc_per_node={nproc}",
            f"--master_port={free_port()}", str(DRIVER), *args]


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="")


def test_a_shared_mistake_is_one_line_and_the_ranks_exit_code():
    run = subprocess.run(_launch_cmd(2, "--batch-size", "0"), cwd=REPO, env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2, run.stderr  # the ranks' code, where torchrun says 1
    assert run.stderr.strip() == "hybrid_engine: error: --batch-size must be >= 1, got 0"
    assert run.stdout == ""


def test_a_rank_killed_by_a_signal_is_named_in_one_line():
    env = dict(_env(), HYBRID_ENGINE_TEST_KILL_AT_STEP="1", HYBRID_ENGINE_TEST_KILL_RANK="1")
    run = subprocess.run(_launch_cmd(2, "--dp", "2", *SMALL, "--steps", "4"), cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=90)
    assert run.returncode == 128 + signal.SIGKILL, run.stderr
    ours = [ln for ln in run.stderr.splitlines() if ln.startswith("hybrid_engine: launch:")]
    assert len(ours) == 1 and re.match(r"hybrid_engine: launch: rank 1 was killed by SIGKILL", ours[0]), run.stderr
    assert "Traceback" not in run.stderr and "FAILED" not in run.stderr


def test_ctrl_c_under_the_launcher_is_one_line_per_rank_and_exit_130(tmp_path):
    # A terminal's Ctrl-C signals the whole foreground process group: the launcher and every rank.
    proc = subprocess.Popen(_launch_cmd(2, "--pp", "2", *SMALL, "--steps", "100000"), cwd=REPO, env=_env(),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        while proc.poll() is None and not proc.stdout.readline().startswith("step"):
            pass  # training has begun on every rank
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    lines = sorted(ln for ln in err.splitlines() if ln.strip())
    assert len(lines) == 2, err  # one per rank, nothing from the launcher
    for rank, line in enumerate(lines):
        assert re.fullmatch(rf"hybrid_engine: rank {rank}: interrupted at step \d+; last checkpoint none", line), err
