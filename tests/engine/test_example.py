"""The public-API example in examples/ runs on CPU as the README says, and its loss falls."""
import re
import subprocess
import sys

from launch_utils import REPO, free_port


def test_custom_model_example_trains_on_four_cpu_ranks():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=4", f"--master_port={free_port()}",
           str(REPO / "examples" / "custom_model.py")]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    losses = [float(x) for x in re.findall(r"loss ([0-9.]+)", run.stdout)]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], run.stdout
