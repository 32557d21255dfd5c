"""DP gradients on the wire in bf16 (DpGradSync's wire dtype, the driver's --dp-grad-dtype bf16).

The bucket stays fp32; at launch it is cast to bf16, the bf16 copies are summed, and finish() casts the sum back:
each replica's gradient and the sum are rounded to bf16, nothing else changes. Checked exactly on raw buckets,
and on a dp=2 engine against the fp32 all-reduce (close, not equal)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from hybrid_engine import _C, ProcessGrid
from engine_builders import make_engine
from hybrid_engine.config.engine import DataParallelConfig
from hybrid_engine.metrics import records
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model

REPO = Path(__file__).resolve().parents[2]


def replica_grads(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    # values over many binades, so the bf16 rounding of each term and of the sum both matter
    return [torch.randn(n, generator=gen) * torch.logspace(-3, 3, n) for n in (1000, 37)]


def sum_on_wire(rank: int, world: int, wire) -> list:
    buckets = [g.clone() for g in replica_grads(rank)]
    sync = _C.DpGradSync(buckets, dist.group.WORLD, wire)
    sync.launch(1)
    sync.finish()
    return [b.numpy() for b in buckets] + [str(sync.wire_dtype)]


@pytest.mark.parametrize("wire", [torch.bfloat16, None, torch.float32])
def test_buckets_are_summed_in_the_wire_dtype_and_cast_back(wire):
    results = run_ranks(2, sum_on_wire, wire, timeout=60)
    grads = [replica_grads(r) for r in range(2)]
    for b in range(2):
        if wire is torch.bfloat16:
            expected = (grads[0][b].bfloat16().float() + grads[1][b].bfloat16().float()).bfloat16().float()
        else:
            expected = grads[0][b] + grads[1][b]
        for rank_result in results:
            assert torch.equal(torch.from_numpy(rank_result[b]), expected), (wire, b)
            assert str(rank_result[b].dtype) == "float32"  # the bucket keeps its dtype
    assert results[0][2] == str(wire)


def train(rank: int, world: int, wire) -> dict:
    groups = build_groups(ProcessGrid(2, 1, 1), rank)
    engine = make_engine(large_linear_model(32, 4, 0), groups, micro_batches=2, lr=0.05,
                         dp_grad_dtype="bf16" if wire is torch.bfloat16 else "fp32")
    data = SyntheticRegression(32, 0, "cpu")
    losses = []
    for step in range(4):
        x, y = data.batch(step, 32, rank * 16, (rank + 1) * 16)
        losses.append(engine.train_step(x, y).loss)
    state = {k: t.numpy() for k, t in engine.full_state_dict().items()}
    engine.close()
    groups.destroy()
    return {"losses": losses, "state": state}


def test_bf16_wire_trains_close_to_the_fp32_all_reduce():
    bf16 = run_ranks(2, train, torch.bfloat16, timeout=120)
    fp32 = run_ranks(2, train, None, timeout=120)
    assert bf16[0]["losses"] == bf16[1]["losses"]  # replicas agree: every rank adds the same bf16 values
    assert bf16[0]["losses"] == pytest.approx(fp32[0]["losses"], rel=1e-3)
    differs = False
    for key, value in fp32[0]["state"].items():
        got = torch.from_numpy(bf16[0]["state"][key])
        want = torch.from_numpy(value)
        assert torch.allclose(got, want, rtol=1e-2, atol=1e-4), key
        assert torch.equal(got, torch.from_numpy(bf16[1]["state"][key])), key  # replicas stay identical
        differs |= not torch.equal(got, want)
    assert differs, "bf16 on the wire left every weight bit-identical to the fp32 all-reduce: nothing was cast"


def test_engine_refuses_other_wire_dtypes():
    with pytest.raises(ValueError, match="grad_dtype"):
        DataParallelConfig(grad_dtype="int8").validate()


def _driver_losses(tmp_path, wire: str) -> list[float]:
    metrics = tmp_path / f"{wire}.jsonl"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "hybrid_engine.py",
                           "--dp", "2", "--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "2",
                           "--steps", "3", "--dp-grad-dtype", wire, "--metrics", str(metrics)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "summary:" in done.stdout
    return [r["loss"] for r in records.steps(records.read(metrics))]


def test_driver_flag(tmp_path):
    """--dp-grad-dtype bf16 reaches the gradient sync: the driver's losses after the first update are not the fp32
    wire's (the bf16-rounded gradient moved the weights elsewhere), yet close to them."""
    bf16, fp32 = _driver_losses(tmp_path, "bf16"), _driver_losses(tmp_path, "fp32")
    assert len(bf16) == len(fp32) == 3
    assert bf16[0] == fp32[0]  # the first step's loss is before any update
    assert bf16[1:] != fp32[1:], "--dp-grad-dtype bf16 trained exactly as fp32: the flag did not reach the sync"
    assert bf16 == pytest.approx(fp32, rel=1e-2)
