"""--cuda-graphs on the driver's command line, on the CPU: auto says once that it is off and why, and on is one line
and exit code 2 before any process group exists (so before the first collective)."""
import os
import subprocess
import sys

from launch_utils import DRIVER, REPO, free_port

SMALL = ("--dim", "32", "--depth", "2", "--batch-size", "8", "--micro-batches", "2", "--steps", "1", "--warmup", "0")


def _driver(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return subprocess.run([sys.executable, str(DRIVER), *SMALL, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_auto_is_off_on_the_cpu_and_says_so_once():
    done = _driver()
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith("CUDA graphs")]
    assert said == ["CUDA graphs off (auto: the CPU has no CUDA graphs)"]


def test_on_is_refused_on_the_cpu_with_one_line_and_exit_2_before_any_process_group():
    done = _driver("--cuda-graphs", "on", "--trace", "/nonexistent/never-written")
    assert done.returncode == 2
    assert done.stderr == ("hybrid_engine: error: --cuda-graphs on: the CPU has no CUDA graphs; use --cuda-graphs "
                           "auto or off\n")
    assert "rank" not in done.stdout and "grid" not in done.stdout  # nothing of the run's set-up was said
