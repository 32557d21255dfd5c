"""A fourth model, registered in one line from tests/ (tests/tiny_model_driver.py registers tests/tiny_model.py's
entry in each rank, nothing of the engine changed), trains through the real driver on a pp2 x mp2 grid of four gloo
ranks: it learns, and its loss curve is one rank's to 1e-5 in fp32."""
import json
from pathlib import Path

from hybrid_engine.models import registry
from launch_utils import torchrun

DRIVER = Path(__file__).resolve().parents[1] / "tiny_model_driver.py"
STEPS = 24


def _losses(tmp_path: Path, nproc: int, *grid: str) -> list[float]:
    metrics = tmp_path / f"metrics_{nproc}.jsonl"
    run = torchrun(nproc, "--model", "tiny", *grid, "--steps", str(STEPS), "--batch-size", "32", "--amp", "off",
                   "--metrics", str(metrics), driver=DRIVER, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "model: tiny, 2 x [Linear(8, 16) + Tanh + Linear]" in run.stdout
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]


def test_a_fourth_model_trains_on_pp2_mp2_like_one_rank(tmp_path):
    one = _losses(tmp_path, 1)
    grid = _losses(tmp_path, 4, "--pp", "2", "--mp", "2")
    assert len(one) == len(grid) == STEPS
    assert max(abs(a - b) for a, b in zip(one, grid)) <= 1e-5, (one, grid)
    assert sum(grid[-4:]) < 0.6 * sum(grid[:4]), grid  # it learns: the loss falls to well under its start
    assert "tiny" not in registry.names()  # registered in the ranks only, never in this process
