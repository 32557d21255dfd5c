"""Direct `srun` launch: one task per GPU, no torchrun. SLURM's variables become the launcher variables the rest of
the driver reads (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), once, at the process's edge, as torchrun
would have set them:

    RANK = SLURM_PROCID, WORLD_SIZE = SLURM_NTASKS, LOCAL_RANK = SLURM_LOCALID (the GPU: cuda:LOCAL_RANK; 0 when
                  SLURM bound the task to a single GPU it alone sees)
    MASTER_ADDR = the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST): task 0 runs there and serves the
                  rendezvous store
    MASTER_PORT = 20000 + SLURM_JOB_ID mod 12768, the same on every task without talking, and below Linux's
                  ephemeral range (32768-60999), where any outgoing connection on the node may hold a port; an
                  explicit MASTER_PORT (or MASTER_ADDR) in the environment wins

Only a task of an srun step is taken for one (SLURM_STEP_ID set): the batch script itself also carries
SLURM_PROCID=0 and SLURM_NTASKS, and a driver started there by hand must stay one process, not wait for peers that
never come. Under torchrun (RANK and WORLD_SIZE set, e.g. one agent per node started by srun) nothing changes.
"""
from __future__ import annotations

import os
import socket
from typing import MutableMapping

from hybrid_engine.config import ConfigError

from .hostlist import HostlistError, first_host

PORT_BASE, PORT_SPAN = 20000, 32768 - 20000  # up to the ephemeral range
MAX_TASKS = 2**20  # beyond any allocation: a larger SLURM_NTASKS is damaged


def is_srun_task(environ: MutableMapping[str, str]) -> bool:
    """A task of an srun step that no launcher inside it (torchrun) has given rank variables."""
    return ("SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ
            and "RANK" not in environ and "WORLD_SIZE" not in environ)


def _int(environ: MutableMapping[str, str], name: str) -> int:
    raw = environ.get(name, "")
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer (srun sets it)") from None


def _task_number(environ: MutableMapping[str, str]) -> tuple[int, int]:
    """(SLURM_PROCID, SLURM_NTASKS), each a number and the task one of the tasks, or one ConfigError."""
    rank, world = _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_NTASKS")
    if not 1 <= world <= MAX_TASKS:
        raise ConfigError(f"environment variable SLURM_NTASKS={world} is not a number of tasks in [1, {MAX_TASKS}] "
                          "(srun sets it)")
    if not 0 <= rank < world:
        raise ConfigError(f"environment variable SLURM_PROCID={rank} is not a task of SLURM_NTASKS={world} (0 to "
                          f"{world - 1}; srun sets it)")
    return rank, world


def speaks_for_error(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether this task says an error found before any rank exists: task 0 what every task finds alike; a task
    whose own SLURM_PROCID cannot be read or names no task what no other task finds."""
    try:
        rank = int(environ.get("SLURM_PROCID", "0"))
    except ValueError:
        return True
    try:
        world = int(environ.get("SLURM_NTASKS", ""))
    except ValueError:
        return rank == 0
    return rank == 0 or (world >= 1 and not 0 <= rank < world)


def check_rendezvous_host(environ: MutableMapping[str, str] = os.environ) -> None:
    """MASTER_ADDR resolves, or one ConfigError at once: else every task waits out the rendezvous timeout and ends in
    a wrong diagnosis. For an srun task, once adopt_srun_environment has set it."""
    host = environ.get("MASTER_ADDR", "")
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"the rendezvous host MASTER_ADDR={host!r} (task 0's: the first host of the node list "
                          f"unless set) does not resolve ({getattr(exc, 'strerror', None) or exc}): set MASTER_ADDR "
                          "to task 0's host") from None


def rendezvous_port(job_id: int) -> int:
    """The port every task of a job derives alike; two jobs sharing a first node differ unless their ids are
    PORT_SPAN apart."""
    return PORT_BASE + job_id % PORT_SPAN


def adopt_srun_environment(environ: MutableMapping[str, str] = os.environ, visible_gpus: int = 0) -> str | None:
    """Under a bare srun task, write the launcher variables from SLURM's into `environ` and return a one-line
    description of the launch (rank 0 prints it); None when this is no srun task. ConfigError for a variable that
    cannot be read, before anything else runs. `visible_gpus`: the GPUs this task sees; exactly one means SLURM bound
    the task to its own GPU (srun --gpus-per-task=1, --gpu-bind), which is then cuda:0 whatever SLURM_LOCALID."""
    if not is_srun_task(environ):
        return None
    rank, world = _task_number(environ)
    local = _int(environ, "SLURM_LOCALID") if "SLURM_LOCALID" in environ and visible_gpus != 1 else 0
    if local < 0:
        raise ConfigError(f"environment variable SLURM_LOCALID={local} is negative (srun sets it: the task's index on "
                          "its node)")
    nodelist_var = "SLURM_STEP_NODELIST" if environ.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodelist = environ.get(nodelist_var, "")
    if "MASTER_ADDR" not in environ:
        if not nodelist:
            raise ConfigError("srun task without SLURM_JOB_NODELIST: cannot tell where task 0 serves the rendezvous "
                              "(set MASTER_ADDR)")
        try:
            environ["MASTER_ADDR"] = first_host(nodelist)
        except HostlistError as exc:
            raise ConfigError(f"{nodelist_var}: {exc} (set MASTER_ADDR to task 0's host)") from None
    if "MASTER_PORT" not in environ:
        if "SLURM_JOB_ID" not in environ:
            raise ConfigError("srun task without SLURM_JOB_ID: cannot derive the rendezvous port (set MASTER_PORT)")
        environ["MASTER_PORT"] = str(rendezvous_port(_int(environ, "SLURM_JOB_ID")))
    environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local))
    return (f"srun launch: {world} tasks, rendezvous at {environ['MASTER_ADDR']}:{environ['MASTER_PORT']} "
            f"(task 0 serves it)")


def requeue_count(environ: MutableMapping[str, str] = os.environ) -> int:
    """How often SLURM has requeued this job (`sbatch --requeue`, a preemption): SLURM_RESTART_COUNT, 0 if unset."""
    raw = environ.get("SLURM_RESTART_COUNT", "0")
    return int(raw) if raw.isdigit() else 0
