"""The distributed optimizer (ZeRO-1, hybrid_engine/optim/zero.py): sharded optimizer state over DP trains exactly like
the replicated one, agrees on skips over DP, holds 1/dp of the state, and checkpoints reshard across dp sizes and
between sharded and replicated runs."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model

CFG = dict(dim=32, depth=4, batch_size=32, micro_batches=2, steps=4, lr=0.05)
GRIDS = [  # (dp, pp, mp, schedule, options), four ranks each
    (4, 1, 1, "1f1b", dict(optimizer="adam", lr=1e-2)),
    (2, 2, 1, "1f1b", dict(clip_grad=0.05)),
    (2, 2, 1, "zb1", dict(merge_weight_grads=True, optimizer="adamw", lr=1e-2)),
    (2, 1, 2, "1f1b", dict(clip_grad=0.05, optimizer="adam", lr=1e-2)),
]


def _rows(groups, dp: int, step: int):
    x, y = SyntheticRegression(CFG["dim"], 0, "cpu").batch(step, CFG["batch_size"])
    d, per = groups.coords.dp, CFG["batch_size"] // dp
    return x[d * per:(d + 1) * per], y[d * per:(d + 1) * per]


def _engine(groups, schedule: str, zero: int, options: dict, dp_bucket_mb: float = 0.004):
    opts = dict(options)
    lr = opts.pop("lr", CFG["lr"])
    # a small bucket cap: several buckets, each cut into DP shards that split layers mid-tensor
    return make_engine(large_linear_model(CFG["dim"], CFG["depth"], 0), groups, schedule=schedule,
                       micro_batches=CFG["micro_batches"], lr=lr, zero=zero, dp_bucket_mb=dp_bucket_mb, **opts)


def curves(rank: int, world: int, grids: list[tuple]) -> list[dict]:
    out = []
    for dp, pp, mp, schedule, options in grids:
        result = {}
        for zero in (0, 1):
            groups = build_groups(ProcessGrid(dp, pp, mp), rank)
            engine = _engine(groups, schedule, zero, options)
            losses, norms = [], []
            for step in range(CFG["steps"]):
                r = engine.train_step(*_rows(groups, dp, step))
                losses.append(r.loss)
                norms.append(r.grad_norm)
            state = {k: v.numpy() for k, v in engine.full_state_dict().items()}
            result[zero] = {"losses": losses, "norms": norms, "state": state, "bytes": engine.optimizer_state_bytes(),
                            "params": sum(p.numel() for p in engine.parameters)}
            engine.close()
            groups.destroy()
            dist.barrier()
        out.append(result)
    return out


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture(scope="module")
def results():
    return run_ranks(4, curves, GRIDS, timeout=300)


@pytest.mark.parametrize("index", range(len(GRIDS)), ids=[f"dp{g[0]}pp{g[1]}mp{g[2]}-{g[3]}" for g in GRIDS])
def test_zero1_reproduces_the_replicated_curve(results, index):
    for rank_results in results:
        plain, sharded = rank_results[index][0], rank_results[index][1]
        assert sharded["losses"] == pytest.approx(plain["losses"], rel=1e-5)
        if GRIDS[index][4].get("clip_grad"):
            assert sharded["norms"] == pytest.approx(plain["norms"], rel=1e-5)  # the norm counts each element once
        for key, want in plain["state"].items():
            assert _rel(sharded["state"][key], want) < 1e-5, key


def test_zero1_holds_one_dp_th_of_the_optimizer_state(results):
    for rank_results in results:
        plain, sharded = rank_results[0][0], rank_results[0][1]  # Adam, dp=4: two fp32 moments per element
        assert 0 <= plain["bytes"] - 2 * 4 * plain["params"] <= 4 * 16  # + a 4-byte step count per tensor
        # each bucket is padded to a multiple of dp: at most dp - 1 elements more per bucket (a few buckets)
        assert plain["bytes"] / 4 - 4 * 16 <= sharded["bytes"] <= plain["bytes"] / 4 + 2 * 4 * 3 * 16


def overflow_run(rank: int, world: int, inject_rank: int, inject_step: int) -> dict:
    """fp16 half weights under ZeRO-1: one DP rank finds an inf in its own shard of the summed gradients."""
    out = {}
    groups = build_groups(ProcessGrid(2, 1, 1), rank)
    engine = _engine(groups, "1f1b", 1, dict(amp="fp16"))
    step_count = {"n": 0}

    def poison(e) -> None:
        if rank == inject_rank and step_count["n"] == inject_step:
            e.zero.grad_shards[0].view(-1)[0] = float("inf")
        step_count["n"] += 1

    engine.add_post_backward_hook(poison)
    history = []
    for step in range(CFG["steps"]):
        before = {k: v.numpy() for k, v in engine.full_state_dict().items()}
        r = engine.train_step(*_rows(groups, 2, step))
        after = {k: v.numpy() for k, v in engine.full_state_dict().items()}
        history.append((r.skipped, r.loss_scale, all((before[k] == after[k]).all() for k in before)))
    out["history"] = history
    engine.close()
    groups.destroy()
    return out


def test_an_overflow_in_one_dp_shard_skips_the_step_on_every_rank():
    results = run_ranks(2, overflow_run, 1, 2, timeout=120)
    for out in results:
        skipped = [s for s, _, _ in out["history"]]
        unchanged = [u for _, _, u in out["history"]]
        assert skipped == [False, False, True, False], out["history"]
        assert unchanged == skipped  # a skipped step leaves every weight; the others change them
        scales = [scale for _, scale, _ in out["history"]]
        assert scales[3] == scales[2] / 2
    assert results[0]["history"] == results[1]["history"]


def save_state(rank: int, world: int, dp: int, zero: int, steps: int) -> dict:
    groups = build_groups(ProcessGrid(dp, 1, 1), rank)
    engine = _engine(groups, "1f1b", zero, dict(optimizer="adam", lr=1e-2))
    losses = [engine.train_step(*_rows(groups, dp, step)).loss for step in range(steps)]
    state = engine.state_for_checkpoint()
    engine.close()
    groups.destroy()
    to_numpy = {k: v.numpy() for k, v in state["weights"].items()}
    opt = {k: {kk: (vv.numpy() if torch.is_tensor(vv) else vv) for kk, vv in d.items()}
           for k, d in state["optimizer"].items()}
    return {"losses": losses, "weights": to_numpy, "optimizer": opt}


def resume_state(rank: int, world: int, dp: int, zero: int, saved: dict, first: int, steps: int) -> list[float]:
    groups = build_groups(ProcessGrid(dp, 1, 1), rank)
    engine = _engine(groups, "1f1b", zero, dict(optimizer="adam", lr=1e-2))
    weights = {k: torch.from_numpy(v) for k, v in saved["weights"].items()}
    opt = {k: {kk: (torch.from_numpy(vv) if hasattr(vv, "shape") else vv) for kk, vv in d.items()}
           for k, d in saved["optimizer"].items()}
    engine.load_checkpoint_state(weights, opt, None)
    losses = [engine.train_step(*_rows(groups, dp, step)).loss for step in range(first, steps)]
    engine.close()
    groups.destroy()
    return losses


@pytest.mark.parametrize("before,after", [((2, 1), (4, 1)), ((4, 1), (2, 0)), ((2, 0), (2, 1))],
                         ids=["dp2-zero->dp4-zero", "dp4-zero->dp2-replicated", "dp2-replicated->dp2-zero"])
def test_checkpoint_state_reshards_across_dp_sizes_and_zero(before, after):
    (dp_a, zero_a), (dp_b, zero_b) = before, after
    straight = run_ranks(dp_a, save_state, dp_a, zero_a, 4, timeout=120)[0]["losses"]
    saved = run_ranks(dp_a, save_state, dp_a, zero_a, 2, timeout=120)[0]
    resumed = run_ranks(dp_b, resume_state, dp_b, zero_b, saved, 2, 4, timeout=120)
    for losses in resumed:
        assert saved["losses"] + losses == pytest.approx(straight, rel=1e-5)


def _losses(stdout: str) -> list[float]:
    import re
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", stdout)]


def _metrics(path) -> list[dict]:
    from hybrid_engine.metrics import records
    return records.steps(records.read(path))


def test_driver_zero_flag_trains_like_the_replicated_run_and_its_checkpoint_loads_unsharded(tmp_path):
    from launch_utils import torchrun

    common = ("--dim", "32", "--depth", "4", "--batch-size", "16", "--micro-batches", "2", "--optimizer", "adam",
              "--lr", "0.01", "--steps", "4")
    plain = torchrun(2, "--dp", "2", "--zero", "0", *common, "--metrics", str(tmp_path / "plain.jsonl"))
    sharded = torchrun(2, "--dp", "2", "--zero", "1", *common, "--save", str(tmp_path / "ckpt"), "--save-every", "2",
                       "--metrics", str(tmp_path / "sharded.jsonl"))
    assert plain.returncode == 0 and sharded.returncode == 0, sharded.stderr[-2000:]
    assert "ZeRO-1" in sharded.stdout  # the choices are announced
    assert "zero: parameter all-gather overlapped with the next forward, per bucket" in sharded.stdout
    assert _losses(sharded.stdout) == pytest.approx(_losses(plain.stdout), rel=1e-5)
    # Memory accounting per rank: Adam's two fp32 moments of 4 x (32 x 32 + 32) parameters and a 4-byte step count
    # per tensor (8 tensors replicated; 1 flat shard of the one bucket under ZeRO-1); fp32 weights are their own
    # masters.
    params = 4 * (32 * 32 + 32)
    for want_state, records in ((8 * params + 8 * 4, _metrics(tmp_path / "plain.jsonl")),
                                (8 * params // 2 + 4, _metrics(tmp_path / "sharded.jsonl"))):
        assert len(records) == 4
        for rec in records:
            assert rec["master_bytes"] == [0, 0] and rec["optimizer_state_bytes"] == [want_state] * 2
            # the reserved peak beside the allocated one, per rank (on the CPU both are the process's resident peak)
            assert len(rec["peak_reserved_gib"]) == 2 and rec["peak_reserved_gib"] == pytest.approx(rec["peak_mem_gib"],
                                                                                                   abs=2e-3)
    resumed = torchrun(1, "--zero", "0", *common, "--load", str(tmp_path / "ckpt" / "step_000002"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _losses(resumed.stdout) == pytest.approx(_losses(sharded.stdout)[2:], rel=1e-5)


def master_bytes(rank: int, world: int) -> dict:
    out = {}
    for zero in (0, 1):
        groups = build_groups(ProcessGrid(2, 1, 1), rank)
        engine = _engine(groups, "1f1b", zero, dict(amp="fp16", optimizer="adam", lr=1e-2))
        engine.train_step(*_rows(groups, 2, 0))
        out[zero] = (engine.master_bytes(), engine.optimizer_state_bytes(),
                     sum(p.numel() for p in engine.parameters), len(engine.parameters), len(engine.grads.buckets))
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


def test_zero1_at_dp2_holds_half_the_masters_and_optimizer_state():
    for out in run_ranks(2, master_bytes, timeout=120):
        (plain_masters, plain_state, params, tensors, _), (masters, state, _, _, buckets) = out[0], out[1]
        assert plain_masters == 4 * params  # fp32 masters of fp16 weights
        assert plain_state == 8 * params + 4 * tensors  # two fp32 moments, a step count per tensor
        # each bucket is padded to an even length, its shard then holds at most one element more than half
        assert 0 <= masters - plain_masters / 2 <= 4 * buckets
        assert 0 <= state - (plain_state - 4 * tensors) / 2 - 4 * buckets <= 8 * buckets
