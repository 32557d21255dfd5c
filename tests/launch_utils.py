"""Launch the real driver under torchrun, as a user would, with a hard time limit."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "hybrid_engine.py"
_PORTS = random.SystemRandom()  # not the module's generator: a test that seeds it would make workers draw alike


def free_port() -> int:
    """A port nothing listens on, drawn below Linux's ephemeral range (32768-60999): a port the OS hands out for
    bind(0) is one it may hand again, a moment later, to any of the gloo connections other tests open meanwhile,
    and the rendezvous store that then binds it fails with EADDRINUSE."""
    for _ in range(200):
        port = _PORTS.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767 after 200 tries")


def torchrun(nproc: int, *args: str, timeout: float = 120, extra_env: dict | None = None,
             torchrun_args: tuple[str, ...] = (), driver: Path = DRIVER) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=N hybrid_engine.py ARGS` on CPU (or another driver script); kills the whole run
    after `timeout`."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""})
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", *torchrun_args, str(driver), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
