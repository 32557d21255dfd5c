"""Launch the real driver under torchrun, as a user would, with a hard time limit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "hybrid_engine.py"
sys.path.insert(0, str(REPO / "experiments" / "bench"))

from launch import free_port  # noqa: E402  (the one rule for a rendezvous port, the benchmarks' too)


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
