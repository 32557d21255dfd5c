"""experiments/peers/torchtitan_llama.py, the torchtitan peer of the ZeRO comparison: a bad shape or a torchtitan it
cannot import is one line and exit 2 before any process group (no torchtitan needed); with torchtitan importable
(it is not in CI: the test skips), its gloo smoke run on 2 CPU ranks trains torchtitan's Llama-3 and prints the
FSDP2 peer's JSON keys, counting the parameters as the FSDP2 peer does."""
import json
import math
import os
import subprocess
import sys

import pytest

from launch_utils import REPO, torchrun

SCRIPT = REPO / "experiments" / "peers" / "torchtitan_llama.py"
TINY = ["--cpu", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "128", "--seq", "32",
        "--vocab", "512", "--batch", "8", "--micro", "2", "--steps", "3", "--warmup", "1"]


def _alone(*args, pythonpath=None):
    """The script by hand, one process, no torchrun: what it refuses, it refuses before any process group."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath, env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,said", [
    (["--batch", "6", "--micro", "4"], "--batch 6 must split into 1 ranks x --micro 4 micro-batches"),
    (["--hidden", "64", "--heads", "5"],
     "--hidden 64 must split into --heads 5 even-sized heads, shared by --kv-heads 8"),
    (["--steps", "3", "--warmup", "3"], "--warmup 3 must leave at least one of --steps 3 timed"),
    (["--micro", "0"], "--micro must be at least 1, got 0"),
])
def test_a_bad_shape_is_one_line_and_exit_2(args, said):
    run = _alone("--cpu", *args)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stdout.strip() == f"torchtitan_llama: {said}"


def test_a_torchtitan_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "torchtitan").mkdir()
    (tmp_path / "torchtitan" / "__init__.py").write_text("raise ImportError('this torchtitan is broken')\n")
    run = _alone("--cpu", *TINY[1:], pythonpath=str(tmp_path))
    assert run.returncode == 2, run.stderr[-2000:]
    line, = run.stdout.strip().splitlines()
    assert line.startswith("torchtitan_llama: torchtitan cannot be imported under torch ")
    assert line.endswith("ImportError: this torchtitan is broken")


def test_the_gloo_smoke_run_trains_torchtitans_llama3_and_prints_the_fsdp2_peers_keys():
    pytest.importorskip("torchtitan.models.llama3", exc_type=ImportError)
    run = torchrun(2, *TINY, driver=SCRIPT, timeout=180)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    said = [line for line in run.stdout.splitlines() if line.startswith("torchtitan_llama: torch ")]
    assert len(said) == 1 and "FSDP over 2 ranks, 2 micro-batches of 2" in said[0]
    row = json.loads([line for line in run.stdout.splitlines() if line.startswith("{")][-1])
    assert {"peer", "world", "params", "step_ms", "tokens_s", "mfu", "peak_gib", "losses", "card"} <= row.keys()
    assert row["peer"].startswith("torchtitan-llama3") and row["world"] == 2 and row["card"] == "cpu"
    d, ffn, vocab, layers, kv_dim = 64, 128, 512, 2, 2 * 16
    per_layer = d * (d + 2 * kv_dim) + d * d + 3 * d * ffn + 2 * d  # fused qkv, wo, SwiGLU, two norms
    assert row["params"] == 2 * vocab * d + layers * per_layer + d  # embedding and head untied, final norm
    assert len(row["losses"]) == 3 and all(math.isfinite(x) for x in row["losses"])
    # torchtitan's head init (std d^-1/2) starts near ln V + 1/2; three AdamW steps on random tokens bring it down
    assert abs(row["losses"][0] - (math.log(vocab) + 0.5)) < 0.3 and row["losses"][-1] < row["losses"][0]
