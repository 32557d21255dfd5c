"""The GPT's pp=2 / tp=2 peers (experiments/peers/gpt_pp_tp_peers.py) on CPU + gloo at a toy shape, fp32: the
torch.distributed.pipelining stages and DTensor tensor parallelism (with and without SequenceParallel) reproduce
the one-process plain-PyTorch losses step by step, and those are the engine's own losses -- the premise of the
GPU pass comparing every torch peer's losses with the engine's 1-GPU run (same initial weights, same draw of
every step). Megatron needs CUDA and is never imported here."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments" / "bench"))

import launch  # noqa: E402
from hybrid_engine.data import write_token_file  # noqa: E402

# 4 blocks so that the engine's balanced cut gives each pipeline stage blocks (0..3 | 4..5); batch 8 in 4
# micro-batches; a vocabulary of 512 (even: the tensor-parallel head splits it in two)
SHAPE = ["--hidden", "32", "--layers", "4", "--heads", "4", "--seq-len", "16", "--batch-size", "8",
         "--micro-batches", "4", "--steps", "3", "--warmup", "1", "--seed", "0"]
REL = 1e-5


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gpt_peers") / "tokens.bin"
    write_token_file(str(path), np.random.default_rng(0).integers(0, 512, 50_000), 512)
    return str(path)


def run_peer(mode: str, nproc: int, tokens: str, *extra: str) -> dict:
    cmd = launch.torchrun(nproc, launch.free_port()) + [str(REPO / "experiments" / "peers" / "gpt_pp_tp_peers.py"),
                                                        "--mode", mode, *extra, "--data", tokens, *SHAPE,
                                                        "--precision", "fp32", "--device", "cpu", "--lr", "3e-3"]
    done = subprocess.run(cmd, cwd=REPO, env=launch.child_env(cpu=True), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, launch.worker_stderr(done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, done.stdout  # one record, from the last rank only
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def single(tokens) -> dict:
    return run_peer("single", 1, tokens)


@pytest.mark.parametrize("mode,pp,tp", [("torch-pp", 2, 1), ("dtensor-tp", 1, 2), ("dtensor-tp-sp", 1, 2)])
def test_two_rank_peer_reproduces_the_one_process_losses(mode, pp, tp, tokens, single):
    rec = run_peer(mode, 2, tokens)
    assert (rec["mode"], rec["pp"], rec["tp"], rec["gpus"]) == (mode, pp, tp, 2)
    assert rec["timed_steps"] == 2 and rec["step_ms"] > 0 and len(rec["peak_gib"]) == 2
    assert len(rec["losses"]) == len(single["losses"]) == 3
    assert rec["losses"] == pytest.approx(single["losses"], rel=REL)
    assert single["losses"][-1] != pytest.approx(single["losses"][0], rel=1e-4)  # the steps do train
    if mode == "torch-pp":
        assert rec["stage_modules"] == ["0..3", "4..5"]  # the engine's cut: embeddings + 3 blocks | 1 block + head
    else:
        assert rec["sequence_parallel"] == (mode == "dtensor-tp-sp") and rec["optimizer"].startswith("AdamW")


@pytest.mark.parametrize("schedule,torch_class", [("zbv", "ScheduleZBVZeroBubble"), ("dualpipev", "ScheduleDualPipeV")])
def test_torch_v_schedules_reproduce_the_one_process_losses(schedule, torch_class, tokens, single):
    """torch pipelining's V schedules on the engine's cut into 4 stages and the engine's v placement."""
    rec = run_peer("torch-pp", 2, tokens, "--pp-schedule", schedule)
    assert (rec["schedule"], rec["stages_per_rank"]) == (torch_class, 2)
    assert rec["stage_modules"] == ["0..1", "2..2", "3..4", "5..5"]
    assert rec["losses"] == pytest.approx(single["losses"], rel=REL)


def test_the_peers_train_what_the_engine_trains(tmp_path, tokens, single):
    metrics = tmp_path / "engine.jsonl"
    # The peers' recipe: no clipping (the GPT's default clips at 1.0)
    driver = ["--model", "gpt", "--data", tokens, *SHAPE, "--optimizer", "adamw", "--lr", "3e-3", "--clip-grad", "0",
              "--device", "cpu", "--quiet", "--metrics", str(metrics)]
    cmd = launch.torchrun(1, launch.free_port()) + [str(REPO / "hybrid_engine.py"), *driver]
    done = subprocess.run(cmd, cwd=REPO, env=launch.child_env(cpu=True), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, launch.worker_stderr(done.stderr)
    losses = [json.loads(ln)["loss"] for ln in metrics.read_text().splitlines() if '"loss"' in ln]
    assert losses == pytest.approx(single["losses"], rel=REL)
