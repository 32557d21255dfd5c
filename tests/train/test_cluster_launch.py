"""The driver as a cluster starts it, on this machine. One 8-rank grid (dp 2 x pp 2 x mp 2) trained three ways:

- one torchrun agent of 8 ranks (the reference; it also writes --metrics and --tensorboard);
- two torchrun agents of 4 ranks each (`--nnodes 2`, c10d rendezvous on 127.0.0.1), told different host names
  (HYBRID_ENGINE_HOST): the mapping shows two hosts, every MP group stays within one, the losses equal the
  single agent's bit for bit;
- eight tasks started as a bare `srun` would (SLURM_* variables, no torchrun), two simulated nodes of four: the same
  losses.

Besides: the cross-node MP refusal (two ranks, two hosts, --mp 2) is one line and exit 2; and the TensorBoard event
file holds every step's scalars. Each launch is the expensive part (8 ranks on a few cores): one launch per way,
each checked for several things.
"""
import os
import re
import subprocess
import sys

import pytest
from launch_utils import DRIVER, REPO, free_port, torchrun

from engine_reference import reference_run
from hybrid_engine import ProcessGrid
from hybrid_engine.metrics import records

STEPS = 4
MODEL = ("--dp", "2", "--pp", "2", "--mp", "2", "--dim", "32", "--depth", "4", "--batch-size", "16",
         "--micro-batches", "2", "--lr", "0.05", "--steps", str(STEPS), "--comm-timeout", "60")


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", CUDA_VISIBLE_DEVICES="")
    env.pop("HYBRID_ENGINE_HOST", None)
    env.update(extra)
    return env


def _losses(metrics) -> list[float]:
    return [r["loss"] for r in records.steps(records.read(metrics))]


def _hosts(stdout: str) -> dict[str, list[int]]:
    """The mapping table's hosts and their ranks (`host:` then one row per rank)."""
    hosts, current = {}, None
    for line in stdout.splitlines():
        if re.fullmatch(r"\S+:", line):
            current = hosts.setdefault(line[:-1], [])
        elif current is not None and (row := re.fullmatch(r"\s+(\d+)\s+\d+\s+\d+\s+\d+\s+cpu", line)):
            current.append(int(row.group(1)))
        elif line.startswith("grid "):
            break
    return hosts


def _coords(stdout: str) -> dict[int, tuple[int, int, int]]:
    rows = re.findall(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+cpu$", stdout, flags=re.M)
    return {int(r): (int(dp), int(pp), int(mp)) for r, dp, pp, mp in rows}


@pytest.fixture(scope="module")
def single_agent(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run = torchrun(8, *MODEL, "--metrics", str(out / "metrics.jsonl"), "--tensorboard", str(out / "tb"),
                   timeout=180)
    assert run.returncode == 0, run.stderr
    return run, out


def test_one_agent_prints_every_coordinate_and_trains_the_one_rank_curve(single_agent):
    run, out = single_agent
    grid = ProcessGrid(2, 2, 2)
    table = _coords(run.stdout)
    assert table == {r: tuple(grid.coords(r)) for r in range(8)}
    assert table[5] == (0, 1, 1)  # mp fastest, then dp, then pp
    assert "stage pp=1" in run.stdout and "nodes:" not in run.stdout  # one host: no node marks
    assert re.search(r"^communication check \(.*\): mp 4 groups, slowest [\d.]+ ms .*; dp 4 groups.*; pp 4 groups"
                     r".*; pp channels 16 groups", run.stdout, flags=re.M), run.stdout
    reference, _ = reference_run(32, 4, 16, 2, STEPS, 0.05)
    assert _losses(out / "metrics.jsonl") == pytest.approx(reference, rel=1e-5)


def test_the_tensorboard_event_file_holds_every_steps_scalars(single_agent):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, out = single_agent
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "throughput/samples_per_s", "throughput/tokens_per_s", "time/step_s",
            "memory/peak_gib"} <= tags, tags
    steps = records.steps(records.read(out / "metrics.jsonl"))
    for tag, key in (("train/loss", "loss"), ("time/step_s", "step_time_s"), ("throughput/samples_per_s",
                                                                               "samples_per_s")):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == list(range(STEPS))
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in steps], rel=1e-6)
    assert [s.value for s in events.Scalars("memory/peak_gib")] == pytest.approx(
        [max(r["peak_mem_gib"]) for r in steps], rel=1e-6)


def test_two_torchrun_agents_on_two_hosts_train_the_single_agent_curve(single_agent, tmp_path):
    _, out = single_agent
    port = free_port()
    metrics = tmp_path / "metrics.jsonl"
    agents = [subprocess.Popen(
        [sys.executable, "-m", "hybrid_engine.launch", "--nnodes", "2", "--nproc_per_node", "4",
         "--rdzv_backend", "c10d", "--rdzv_id", "two-agents", "--rdzv_endpoint", f"127.0.0.1:{port}",
         str(DRIVER), *MODEL, "--metrics", str(metrics)],
        cwd=REPO, env=_env(HYBRID_ENGINE_HOST=f"node{n}"), text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE) for n in range(2)]
    try:
        results = [a.communicate(timeout=240) for a in agents]
    finally:
        for a in agents:
            a.kill()
            a.wait()
    assert [a.returncode for a in agents] == [0, 0], [err for _, err in results]
    stdout = "".join(o for o, _ in results)  # rank 0 is in whichever agent the rendezvous made first
    hosts = _hosts(stdout)
    assert sorted(hosts) == ["node0", "node1"] and sorted(map(sorted, hosts.values())) == [[0, 1, 2, 3],
                                                                                           [4, 5, 6, 7]], stdout
    first = next(h for h, ranks in hosts.items() if 0 in ranks)
    second = "node1" if first == "node0" else "node0"
    assert f"ranks by host, 2 hosts: {first} (ranks 0-3), {second} (ranks 4-7)" in stdout
    grid = ProcessGrid(2, 2, 2)
    for group in grid.groups("mp"):  # MP groups stay within a host
        assert len({next(h for h, ranks in hosts.items() if r in ranks) for r in group}) == 1
    assert "spans hosts" not in stdout and "| dp=0: [ 4  5]  n1" in stdout and "|n1" not in stdout
    assert re.search(r"; pp 4 groups, slowest [\d.]+ ms \(ranks \d, \d \(hosts node\d, node\d\)\)", stdout), stdout
    assert _losses(metrics) == _losses(out / "metrics.jsonl")


def test_srun_tasks_without_torchrun_train_the_same_curve(single_agent, tmp_path):
    _, out = single_agent
    metrics = tmp_path / "metrics.jsonl"
    env = _env(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_NTASKS="8", SLURM_JOB_NODELIST="localhost",
               MASTER_PORT=str(free_port()))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        env.pop(name, None)
    tasks = [subprocess.Popen([sys.executable, str(DRIVER), *MODEL, "--metrics", str(metrics)], cwd=REPO, text=True,
                              env=dict(env, SLURM_PROCID=str(r), SLURM_LOCALID=str(r % 4),
                                       HYBRID_ENGINE_HOST=f"gpu0{r // 4 + 1}"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(8)]
    try:
        results = [t.communicate(timeout=240) for t in tasks]
    finally:
        for t in tasks:
            t.kill()
            t.wait()
    assert [t.returncode for t in tasks] == [0] * 8, [err for _, err in results]
    stdout = results[0][0]
    assert stdout.startswith(f"srun launch: 8 tasks, rendezvous at localhost:{env['MASTER_PORT']} (task 0 serves "
                             "it)\n"), stdout
    assert _hosts(stdout) == {"gpu01": [0, 1, 2, 3], "gpu02": [4, 5, 6, 7]}, stdout
    assert all(not o for o, _ in results[1:])  # rank 0 alone reports
    assert _losses(metrics) == _losses(out / "metrics.jsonl")


def test_an_mp_group_across_hosts_is_refused_in_one_line():
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    ranks = [subprocess.Popen([sys.executable, str(DRIVER), "--mp", "2", "--dim", "32", "--depth", "2",
                               "--batch-size", "8", "--steps", "1"], cwd=REPO, text=True,
                              env=dict(env, RANK=str(r), LOCAL_RANK="0", HYBRID_ENGINE_HOST=f"node{r}"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    try:
        results = [p.communicate(timeout=120) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
            p.wait()
    assert [p.returncode for p in ranks] == [2, 2], results
    lines = [ln for _, err in results for ln in err.splitlines()]
    assert lines == [
        "hybrid_engine: error: the MP group of ranks 0, 1 (hosts node0, node1) spans hosts (--mp 2 is more than the 1 "
        "rank of a node): its all-reduces, in every layer of every micro-batch, would cross the network instead of "
        "staying inside a node, typically several times slower; choose --mp and --order so that MP groups stay "
        "within a node, or pass --allow-cross-node-mp"], results
    assert all(not out for out, _ in results)  # refused before the mapping or any step
