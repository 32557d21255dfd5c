"""SLURM without a launcher: host lists expanded as `scontrol show hostnames` would, and an srun task's variables
turned into the rank and rendezvous the driver reads, in one process; a bad one stops the driver before its
rendezvous."""
import os
import subprocess
import sys
import time

import pytest

from hybrid_engine.config import ConfigError
from hybrid_engine.runtime.hostlist import HostlistError, expand, first_host
from hybrid_engine.runtime.slurm import (adopt_srun_environment, is_srun_task, rendezvous_port, requeue_count,
                                         speaks_for_error)
from launch_utils import DRIVER, REPO


@pytest.mark.parametrize("hostlist, hosts", [
    ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
    ("node7", ["node7"]),
    ("a,b", ["a", "b"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # no leading zero: no padding
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),  # the width of the first bound is kept
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),  # leftmost bracket slowest
    ("gpu[1],x[3-3]", ["gpu1", "x3"]),
    (" gpu[01-02] ", ["gpu01", "gpu02"]),
])
def test_hostlists_expand_like_scontrol(hostlist, hosts):
    assert expand(hostlist) == hosts
    assert first_host(hostlist) == hosts[0]


@pytest.mark.parametrize("hostlist, says", [
    ("gpu[01-03", "'[' without ']'"),
    ("gpu01]", "']' without '['"),
    ("gpu[a-b]", "is not numbers and ranges"),
    ("gpu[3-1]", "the range 3-1 runs backwards"),
    ("a,,b", "an empty name"),
    ("gpu[[1]]", "nested '['"),
])
def test_a_malformed_hostlist_names_the_list_and_the_fault(hostlist, says):
    with pytest.raises(HostlistError) as err:
        expand(hostlist)
    assert repr(hostlist) in str(err.value) and says in str(err.value)


def _task(**extra) -> dict:
    env = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
           "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "gpu[01-03,07],cpu5"}
    env.update(extra)
    return env


def test_an_srun_task_becomes_a_rank_with_the_first_host_as_rendezvous():
    env = _task()
    note = adopt_srun_environment(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert env["MASTER_ADDR"] == "gpu01" and env["MASTER_PORT"] == str(rendezvous_port(123456)) == "28544"
    assert note == "srun launch: 8 tasks, rendezvous at gpu01:28544 (task 0 serves it)"


def test_a_task_bound_to_its_own_gpu_uses_cuda_0():
    env = _task()
    adopt_srun_environment(env, visible_gpus=1)  # srun --gpus-per-task=1: each task sees its GPU alone
    assert env["LOCAL_RANK"] == "0" and env["RANK"] == "5"
    env = _task()
    adopt_srun_environment(env, visible_gpus=4)
    assert env["LOCAL_RANK"] == "1"


def test_the_steps_nodelist_wins_and_explicit_master_variables_are_kept():
    env = _task(SLURM_STEP_NODELIST="gpu[07-08]")
    adopt_srun_environment(env)
    assert env["MASTER_ADDR"] == "gpu07"
    env = _task(MASTER_ADDR="10.0.0.9", MASTER_PORT="4242")
    adopt_srun_environment(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"]) == ("10.0.0.9", "4242", "5")


def test_the_batch_script_and_torchrun_are_left_alone():
    batch = _task()
    del batch["SLURM_STEP_ID"]  # sbatch's own shell: SLURM_PROCID=0 and SLURM_NTASKS, but no step
    assert not is_srun_task(batch) and adopt_srun_environment(batch) is None and "RANK" not in batch
    under_torchrun = _task(RANK="3", WORLD_SIZE="4")  # one torchrun agent per node started by srun
    assert adopt_srun_environment(under_torchrun) is None and under_torchrun["RANK"] == "3"


@pytest.mark.parametrize("extra, says", [
    ({"SLURM_PROCID": "x"}, "environment variable SLURM_PROCID='x' is not an integer (srun sets it)"),
    ({"SLURM_JOB_NODELIST": "gpu[01"}, "SLURM_JOB_NODELIST: host list 'gpu[01': '[' without ']' (set MASTER_ADDR "
                                       "to task 0's host)"),
    ({"SLURM_JOB_NODELIST": ""}, "srun task without SLURM_JOB_NODELIST: cannot tell where task 0 serves the "
                                 "rendezvous (set MASTER_ADDR)"),
])
def test_an_unreadable_srun_variable_is_one_line(extra, says):
    with pytest.raises(ConfigError) as err:
        adopt_srun_environment(_task(**extra))
    assert str(err.value) == says


def test_a_requeued_job_counts_as_a_restart():
    assert requeue_count({}) == 0 and requeue_count({"SLURM_RESTART_COUNT": "2"}) == 2


def test_the_first_host_of_a_huge_list_is_found_without_expanding_it():
    # in a process of at most 1 GiB and 60 s: a parser that expands the list (100 billion names) fails there
    # instead of taking this machine's memory
    code = ("import importlib.util, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); "
            "spec = importlib.util.spec_from_file_location('hostlist', sys.argv[1]); m = "
            "importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(m.first_host('n[0-99999999999]'), m.first_host('n[0042-99999999999],x[1-9]'))")
    run = subprocess.run([sys.executable, "-c", code, str(REPO / "hybrid_engine" / "runtime" / "hostlist.py")],
                         capture_output=True, text=True, timeout=60)
    assert run.stdout == "n0 n0042\n", run.stderr[-2000:]
    with pytest.raises(HostlistError) as err:  # the whole list is still checked
        first_host("n[0-99999999999],x[3-1]")
    assert "the range 3-1 runs backwards" in str(err.value)
    with pytest.raises(HostlistError) as err:  # expanding it whole is refused, counted before any name is made
        expand("n[0-99999999999]")
    assert str(err.value) == "host list 'n[0-99999999999]' names 100000000000 hosts, more than 65536: not an allocation"


@pytest.mark.parametrize("extra, says", [
    ({"SLURM_PROCID": "-1"}, "environment variable SLURM_PROCID=-1 is not a task of SLURM_NTASKS=8 (0 to 7; srun "
                             "sets it)"),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "2"}, "environment variable SLURM_PROCID=5 is not a task of "
                                                 "SLURM_NTASKS=2 (0 to 1; srun sets it)"),
    ({"SLURM_NTASKS": "0"}, "environment variable SLURM_NTASKS=0 is not a number of tasks in [1, 1048576] (srun sets "
                            "it)"),
    ({"SLURM_LOCALID": "-2"}, "environment variable SLURM_LOCALID=-2 is negative (srun sets it: the task's index on "
                              "its node)"),
])
def test_a_task_number_out_of_range_is_one_line(extra, says):
    with pytest.raises(ConfigError) as err:
        adopt_srun_environment(_task(**extra))
    assert str(err.value) == says


@pytest.mark.parametrize("procid, ntasks, speaks", [
    ("0", "8", True), ("3", "8", False),  # every task finds a shared variable alike: task 0 says it
    ("abc", "8", True), ("-1", "8", True), ("9", "8", True),  # a task's own number: that task says it
    ("0", "0", True), ("3", "0", False), ("3", "x", False),
])
def test_the_task_that_says_an_error_before_the_rendezvous(procid, ntasks, speaks):
    assert speaks_for_error({"SLURM_PROCID": procid, "SLURM_NTASKS": ntasks}) is speaks


@pytest.mark.parametrize("extra, says", [
    ({"SLURM_PROCID": "-1"}, "SLURM_PROCID=-1 is not a task of SLURM_NTASKS=2"),
    ({"SLURM_PROCID": "5"}, "SLURM_PROCID=5 is not a task of SLURM_NTASKS=2"),
    ({"SLURM_PROCID": "abc"}, "SLURM_PROCID='abc' is not an integer"),
    ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS=0 is not a number of tasks"),
    ({"SLURM_JOB_NODELIST": "no-such-host-hybrid-engine[1-2]"},
     "the rendezvous host MASTER_ADDR='no-such-host-hybrid-engine1' (task 0's: the first host of the node list "
     "unless set) does not resolve"),
])
def test_a_bad_srun_environment_stops_the_driver_at_once_in_one_line(extra, says):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "localhost",
                **extra})
    start = time.monotonic()
    run = subprocess.run([sys.executable, str(DRIVER), "--steps", "1"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and time.monotonic() - start < 30  # no rendezvous was waited for
    assert run.stderr.startswith("hybrid_engine: error: ") and run.stderr.count("\n") == 1, run.stderr
    assert says in run.stderr
