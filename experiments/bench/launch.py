"""Running one benchmark program under torchrun from a parent script (bench.py, max_batch.py).

Every run is a fresh torchrun in its own session, with the NCCL settings of KINDS.md (no NVLink multicast) and
a hard timeout that ends the whole session (the launcher and its workers, nothing else).
"""
from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DRIVER = REPO / "hybrid_engine.py"
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CPU_ENV = {"GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


_GIVEN_PORTS: set[int] = set()
_PORT_LOCK = threading.Lock()
_PORTS = random.SystemRandom()


def free_port() -> int:
    """A port free now, never one this process handed out before (trials may start side by side), drawn below
    Linux's ephemeral range (32768-60999): one the OS hands out for bind(0) it may hand again a moment later to any
    connection (gloo opens many), and the rendezvous store that binds it then fails with EADDRINUSE."""
    with _PORT_LOCK:
        while True:
            port = _PORTS.randrange(20000, 32768)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            if port not in _GIVEN_PORTS:
                _GIVEN_PORTS.add(port)
                return port


def torchrun(nproc: int, port: int | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
    return cmd + ([f"--master_port={port}"] if port is not None else [])


def shown(cmd: list[str]) -> str:
    """The command as a user types it: `torchrun ...` with paths relative to the repository."""
    import shlex

    if cmd[1:3] == ["-m", "torch.distributed.run"]:
        cmd = ["torchrun", *cmd[3:]]
    return shlex.join(cmd).replace(str(REPO) + "/", "")


def child_env(cpu: bool) -> dict:
    env = {**os.environ, **CHILD_ENV}
    if cpu:
        env.update(CPU_ENV)
    return env


def execute(cmd: list[str], env: dict, timeout: float) -> tuple[int | None, str, str, float]:
    """(exit code, or None on timeout; stdout; stderr; seconds). On timeout the run's session gets SIGTERM,
    then SIGKILL: it holds only this run's torchrun and its workers."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, time.monotonic() - start
    except subprocess.TimeoutExpired:
        out, err = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        return None, out or "", err or "", time.monotonic() - start


_LAUNCHER_NOISE = ("torch/distributed/run.py", "torch/distributed/launcher", "torch/distributed/elastic",
                   "<frozen runpy>", "ChildFailedError", "bin/torchrun", "=====", "-----", "warnings.warn",
                   "*****", "Setting OMP_NUM_THREADS")


def worker_stderr(stderr: str, limit: int = 2000) -> str:
    """stderr without torchrun's own failure report, last `limit` characters."""
    keep = [ln for ln in stderr.splitlines() if not any(n in ln for n in _LAUNCHER_NOISE)]
    return "\n".join(keep)[-limit:]


def error_line(stderr: str, rc: int | None) -> str:
    """Why a run failed, in one line: our programs' or the driver's one-line error, else the exception line."""
    lines = [ln.strip() for ln in worker_stderr(stderr, 100_000).splitlines() if ln.strip()]
    pattern = re.compile(r"hybrid_engine: |: error: |Error: |out of memory|Exception: ", re.I)
    hits = [ln for ln in lines if pattern.search(ln) and not ln.startswith(("Traceback", "File "))]
    why = hits[0] if hits else (" | ".join(lines[-3:]) if lines else "no output")
    return ("timed out; " if rc is None else f"exit {rc}: ") + why[:400]


OOM = re.compile(r"out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation", re.I)


def is_oom(stderr: str) -> bool:
    return bool(OOM.search(stderr))


# The launcher, not the program, failed: the rendezvous port was taken between choosing and binding it (another
# run, TIME_WAIT), the rendezvous broke, or the GPU refused a second process (exclusive compute mode). Running the
# same command again on a new port is the fix; it says nothing about the program or its memory.
TRANSIENT = re.compile(r"EADDRINUSE|address already in use|failed to listen on any local network address|"
                       r"RendezvousError|RendezvousConnectionError|RendezvousTimeoutError|"
                       r"busy or unavailable|cudaErrorDevicesUnavailable", re.I)
GPU_BUSY = re.compile(r"busy or unavailable|cudaErrorDevicesUnavailable", re.I)


def is_transient(stderr: str) -> bool:
    return bool(TRANSIENT.search(stderr)) and not is_oom(stderr)


def driver_flags(driver: Path = DRIVER) -> set[str]:
    """Every --flag the engine driver's --help names."""
    out = subprocess.run([sys.executable, str(driver), "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"{driver.name} --help failed ({error_line(out.stderr, out.returncode)})")
    return set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out.stdout))


def missing_flags(cmd: list[str], known: set[str]) -> list[str]:
    """The --flags after the script in `cmd` that the driver does not know."""
    script = next(i for i, a in enumerate(cmd) if a.endswith(".py"))
    return [a for a in cmd[script + 1:] if a.startswith("--") and a not in known]
