"""SLURM without a launcher: host lists expanded as `scontrol show hostnames` would, and an srun task's variables
turned into the rank and rendezvous the driver reads, in one process."""
import pytest

from hybrid_engine.config import ConfigError
from hybrid_engine.runtime.hostlist import HostlistError, expand, first_host
from hybrid_engine.runtime.slurm import adopt_srun_environment, is_srun_task, rendezvous_port, requeue_count


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
    assert env["MASTER_ADDR"] == "gpu01" and env["MASTER_PORT"] == str(rendezvous_port(123456)) == "23456"
    assert note == "srun launch: 8 tasks, rendezvous at gpu01:23456 (task 0 serves it)"


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
