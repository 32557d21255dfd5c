"""The CLI end to end: Ctrl-C is one line per rank and exit 130,
torchrun's own exit code is 1 whatever the ranks' codes, `python -m hybrid_engine` is the same CLI, and a
resumed run's summary times exactly the steps it says it timed."""
import os
import re
import signal
import subprocess
import sys

import pytest

from hybrid_engine.metrics import records
from launch_utils import DRIVER, REPO, free_port, torchrun

SMALL = ("--dim", "32", "--depth", "2", "--batch-size", "8", "--micro-batches", "2")


def _env(**extra) -> dict:
    """One rank on a free port (the driver's fixed default port may still be held by an earlier run)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(extra)
    return env


def test_ctrl_c_is_one_line_per_rank_naming_step_and_checkpoint_and_exit_130(tmp_path):
    env = _env(WORLD_SIZE="2")
    args = ("--pp", "2", *SMALL, "--steps", "100000", "--save", str(tmp_path / "ckpt"), "--save-every", "2")
    procs = [subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=REPO, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    try:
        seen = ""
        while "saved" not in seen and procs[0].poll() is None:  # a checkpoint exists: the line must name it
            seen += procs[0].stdout.readline()
        # ...on every rank: the next step needs every rank, so each has returned from the save and recorded it
        while procs[0].poll() is None and not procs[0].stdout.readline().startswith("step"):
            pass
        for p in procs:  # what a terminal's Ctrl-C does: SIGINT to every process of the job
            p.send_signal(signal.SIGINT)
        results = [p.communicate(timeout=30) for p in procs]  # at once, not after --comm-timeout
    finally:
        for p in procs:
            p.kill()
            p.wait()
    for rank, (p, (_, err)) in enumerate(zip(procs, results)):
        assert p.returncode == 130, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, err  # no traceback, from us or from gloo
        assert re.fullmatch(rf"hybrid_engine: rank {rank}: interrupted at step \d+; last checkpoint "
                            rf"{re.escape(str(tmp_path / 'ckpt'))}/step_\d{{6}}", lines[0]), lines[0]


def test_torchrun_exits_1_when_the_ranks_exit_2_and_names_their_code():
    run = torchrun(2, "--batch-size", "0", timeout=50)
    assert run.returncode == 1  # torchrun's own code, as README says
    assert "exitcode  : 2" in run.stderr
    assert [ln for ln in run.stderr.splitlines() if ln.startswith("hybrid_engine:")] == \
        ["hybrid_engine: error: --batch-size must be >= 1, got 0"]


def test_python_dash_m_runs_the_same_cli():
    done = subprocess.run([sys.executable, "-m", "hybrid_engine", *SMALL, "--steps", "1", "--warmup", "0"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "step    0" in done.stdout and "summary: 1 rank (" in done.stdout
    # The MLP's samples are rows, so no tokens/s beside samples/s, and a tiny model's rate is not "0.0"
    summary = next(ln for ln in done.stdout.splitlines() if ln.startswith("summary:"))
    assert "tokens/s" not in summary
    assert float(re.search(r"; ([0-9.e+-]+) model GFLOP/s per rank", summary).group(1)) > 0  # a CPU is no GPU
    bad = subprocess.run([sys.executable, "-m", "hybrid_engine", "--lr", "nan"], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("hybrid_engine: error: --lr must be a finite")
    assert bad.stderr.count("\n") == 1


@pytest.fixture(scope="module")
def adamw_runs(tmp_path_factory) -> dict:
    """AdamW from the command line: 8 steps straight, and the same 8 as a run of 4 that saves, resumed to 7 (its
    first two steps warm-up, the metrics file written) and resumed again to 8 with no warm-up: stdout and the
    metrics file of each."""
    root = tmp_path_factory.mktemp("adamw")

    def driver(*args: str) -> str:
        done = subprocess.run([sys.executable, str(DRIVER), *SMALL, "--optimizer", "adamw", *args], cwd=REPO,
                              env=_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    save = ("--save", str(root / "ckpt"))
    return {"straight": driver("--steps", "8"), "first": driver("--steps", "4", *save),
            "resumed": driver("--steps", "7", *save, "--resume", "--warmup", "2", "--metrics", str(root / "m.jsonl")),
            "last": driver("--steps", "8", *save, "--resume", "--warmup", "0"), "metrics": root / "m.jsonl"}


def test_a_resumed_run_times_the_steps_its_summary_says_it_timed(adamw_runs):
    out = adamw_runs["resumed"]
    times = {r["step"]: r["step_time_s"] for r in records.steps(records.read(adamw_runs["metrics"]))}
    assert sorted(times) == [4, 5, 6]
    # steps 4 and 5 are this run's warm-up (its first two), so the median is step 6's time: the same number, the
    # summary's rounded to 2 decimals from its own (unrounded) measure, the metrics file's from its record
    said = re.search(r"median step ([0-9.]+) ms after 2 warm-up steps", out)
    assert said is not None, out
    assert abs(float(said.group(1)) - times[6] * 1e3) <= 0.005 + 1e-9, (said.group(1), times[6])
    assert "no warm-up steps left out" in adamw_runs["last"]


def test_adamw_from_the_command_line_trains_and_resumes_bit_for_bit(adamw_runs):
    def losses(out: str) -> list[str]:
        return [line.split()[3] for line in out.splitlines() if line.startswith("step ")]

    straight = losses(adamw_runs["straight"])
    parts = [losses(adamw_runs[run]) for run in ("first", "resumed", "last")]
    assert [len(part) for part in parts] == [4, 3, 1]
    assert parts[0] + parts[1] + parts[2] == straight and len(straight) == 8


def _by_hand(args: tuple, per_rank_env: list[dict]) -> list[tuple[int, str]]:
    """Ranks started by hand (no launcher): [(exit code, stderr)] per rank."""
    env = _env(WORLD_SIZE=str(len(per_rank_env)))
    procs = [subprocess.Popen([sys.executable, str(DRIVER), *args], cwd=REPO, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), **extra},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r, extra in enumerate(per_rank_env)]
    try:
        return [(p.wait(timeout=50), p.communicate()[1]) for p in procs]  # the timeout catches a hang
    finally:
        for p in procs:
            p.kill()


def test_ranks_started_by_hand_say_a_shared_mistake_once_and_all_exit_2():
    results = _by_hand(("--batch-size", "0"), [{}, {}])
    assert [code for code, _ in results] == [2, 2]
    assert results[0][1].splitlines() == ["hybrid_engine: error: --batch-size must be >= 1, got 0"]
    assert results[1][1] == ""  # silent: rank 0 said it


def test_a_mistake_only_one_rank_makes_is_said_by_that_rank_naming_itself():
    # rank 1 never joins, so rank 0 waits out the whole --comm-timeout: a short one
    results = _by_hand((*SMALL, "--comm-timeout", "3"), [{}, {"LOCAL_RANK": "x"}])
    code, err = results[1]
    assert code == 2
    assert err.splitlines() == ["hybrid_engine: rank 1: error: environment variable LOCAL_RANK='x' is not an integer"]
    assert results[0][0] != 0  # rank 0 waited for rank 1 in vain, and said so in its own line
    assert [line for line in results[0][1].splitlines() if line.startswith("hybrid_engine")] == [
        "hybrid_engine: rank 0: not every one of the 2 ranks joined the process group within --comm-timeout 3 s: a "
        "rank was not started, failed before joining, or was given another MASTER_ADDR, MASTER_PORT or WORLD_SIZE"]
