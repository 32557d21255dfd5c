"""ZeRO-1's parameter all-gather overlapped with the next forward (hybrid_engine/parallel/data_parallel/param_gather.py,
csrc/executor/dp_param_gather.h): the curves stay those of the replicated optimizer on every schedule and stage
program, each layer of the forward waits only for its own bucket, and everything that reads or writes parameters
between steps (user access, evaluation, checkpoint save and load, close) finds the whole updated model."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model
from hybrid_engine.models.gpt.workload import gpt_workload

DIM, DEPTH, BATCH, MICRO, STEPS = 32, 4, 32, 4, 4
BUCKET_MB = 0.004  # ~1000 fp32 elements: one layer per bucket (DIM^2 + DIM = 1056), so several buckets


def _rows(groups, step: int, dp: int):
    x, y = SyntheticRegression(DIM, 0, "cpu").batch(step, BATCH)
    d, per = groups.coords.dp, BATCH // dp
    return x[d * per:(d + 1) * per], y[d * per:(d + 1) * per]


def _mlp(groups, zero: int, overlap: bool = True, **options):
    options = {"micro_batches": MICRO, "lr": 0.05, "dp_bucket_mb": BUCKET_MB, **options}
    return make_engine(large_linear_model(DIM, options.pop("depth", DEPTH), 0), groups, zero=zero,
                       overlap_param_gather=overlap, **options)


def _numpy_state(engine) -> dict:
    return {k: v.float().numpy() for k, v in engine.full_state_dict().items()}


def _close(engine, groups) -> None:
    engine.close()
    groups.destroy()
    dist.barrier()


# -------------------------------------------------------------------------- curves: every schedule and program
GRIDS = [  # (dp, pp, mp, options), four ranks each
    (2, 2, 1, dict(schedule="gpipe")),
    (2, 2, 1, dict(schedule="interleaved", virtual_stages=2)),
    (2, 2, 1, dict(schedule="zb1")),
    (2, 2, 1, dict(schedule="1f1b", stage_impl="autograd", recompute=True, optimizer="adam", lr=1e-2)),
    (2, 2, 1, dict(schedule="1f1b", amp="fp16")),  # fused SGD + cast: each bucket's update, then its gather
    (2, 1, 2, dict(schedule="1f1b", optimizer="adamw", lr=1e-2, clip_grad=0.05)),
    (4, 1, 1, dict(schedule="1f1b", optimizer="adam", lr=1e-2)),
]


def curves(rank: int, world: int) -> list[dict]:
    out = []
    for dp, pp, mp, options in GRIDS:
        result = {}
        for key, zero, overlap in (("replicated", 0, True), ("overlapped", 1, True), ("exposed", 1, False)):
            groups = build_groups(ProcessGrid(dp, pp, mp), rank)
            engine = _mlp(groups, zero, overlap, **options)
            losses = [engine.train_step(*_rows(groups, step, dp)).loss for step in range(STEPS)]
            result[key] = {"losses": losses, "state": _numpy_state(engine)}
            _close(engine, groups)
        out.append(result)
    return out


@pytest.fixture(scope="module")
def curve_results():
    return run_ranks(4, curves, timeout=600)


@pytest.mark.parametrize("index", range(len(GRIDS)),
                         ids=[f"dp{g[0]}pp{g[1]}mp{g[2]}-" + "-".join(f"{v}" for v in g[3].values()) for g in GRIDS])
def test_overlapped_gather_reproduces_the_replicated_curve(curve_results, index):
    for rank_results in curve_results:
        want = rank_results[index]["replicated"]
        for key in ("overlapped", "exposed"):
            got = rank_results[index][key]
            assert got["losses"] == pytest.approx(want["losses"], rel=1e-5), key
            for name, value in want["state"].items():
                err = torch.as_tensor(got["state"][name] - value).norm() / torch.as_tensor(value).norm()
                assert err < 1e-5, (key, name)


def gpt_curves(rank: int, world: int) -> dict:
    """The GPT at dp=2 x mp=2 with sequence parallelism: its blocks read their LayerNorm and Linear parameters
    functionally, so only a wait on the whole layer (not on the sub-module that owns them) sees them."""
    from test_gpt_engine import config, dataset

    out = {}
    for zero in (0, 1):
        workload = gpt_workload(config(False), dataset(), sequence_parallel=True)
        groups = build_groups(ProcessGrid(2, 1, 2), rank)
        engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=2, zero=zero,
                             optimizer=optim.SGD(0.1, 0.9), dp_bucket_mb=0.02, **workload.engine_kwargs(1))
        waited = []
        if zero:
            engine.add_post_backward_hook(lambda e: waited.append(e.zero.gather.last_waits()))
        losses = []
        for step in range(3):
            d = groups.coords.dp
            x, y = workload.draw(step, d * 4, (d + 1) * 4)
            losses.append(engine.train_step(x, y).loss)
        out[zero] = {"losses": losses, "state": _numpy_state(engine), "waited": waited,
                     "buckets": len(engine.grads.buckets)}
        _close(engine, groups)
    return out


def test_overlapped_gather_reproduces_the_sequence_parallel_gpt():
    for out in run_ranks(4, gpt_curves, timeout=300):
        # every bucket (several per block) waited for by the forward, before its layer: none left to the update
        assert out[1]["buckets"] > 6
        for waits in out[1]["waited"][1:]:
            assert sorted(b for b, _ in waits) == list(range(out[1]["buckets"]))
            assert {why for _, why in waits} == {"before_use"}
        assert out[1]["losses"] == pytest.approx(out[0]["losses"], rel=1e-5)
        for name, value in out[0]["state"].items():
            assert out[1]["state"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


# ------------------------------------------------------------------------------- who waits, and when
def waits(rank: int, world: int, stage_impl: str) -> dict:
    groups = build_groups(ProcessGrid(2, 1, 1), rank)
    engine = _mlp(groups, 1, stage_impl=stage_impl)
    gather = engine.zero.gather
    seen = {"waits": [], "in_flight_after_step": [], "in_flight_at_first_draw": {}, "at_layer0": {}}
    engine.add_post_backward_hook(lambda e: seen["waits"].append(gather.last_waits()))
    step_now = [0]
    def at_layer0(module, args) -> None:
        seen["at_layer0"].setdefault(step_now[0], gather.in_flight)

    if stage_impl == "autograd":  # registered after the engine's own pre-hook: runs once layer 0 has waited
        engine.stages[0][0].register_forward_pre_hook(at_layer0)
    for step in range(3):
        step_now[0] = step
        x, y = _rows(groups, step, 2)
        chunks = x.chunk(MICRO)

        def inputs(micro: int, chunks=chunks, step=step) -> torch.Tensor:
            if micro == 0:  # drawn as the step's first forward begins, before any layer ran
                seen["in_flight_at_first_draw"].setdefault(step, gather.in_flight)
            return chunks[micro]

        engine.train_step(inputs, y)
        seen["in_flight_after_step"].append(gather.in_flight)
    seen["order"] = engine.zero.launch_order
    seen["layer0_bucket"] = engine.zero.waits.buckets_of(engine._stages[0][0])
    _close(engine, groups)
    return seen


@pytest.mark.parametrize("stage_impl", ["native", "autograd"])
def test_each_layer_waits_only_for_its_own_bucket(stage_impl):
    for seen in run_ranks(2, waits, stage_impl, timeout=120):
        order = seen["order"]
        assert len(order) == DEPTH  # one layer per bucket
        assert order == sorted(order, reverse=True)  # first layer's bucket first (packed last layer first)
        # The update launches every gather and leaves them in flight for the next forward ...
        assert seen["in_flight_after_step"] == [sorted(order)] * 3
        # ... which has waited for none of them when it starts,
        assert seen["in_flight_at_first_draw"] == {0: [], 1: sorted(order), 2: sorted(order)}
        # and then waits for each just before its first layer, in the forward's order (none in step 0).
        assert seen["waits"] == [[], [(b, "before_use") for b in order], [(b, "before_use") for b in order]]
        if stage_impl == "autograd":
            # when layer 0 runs (first micro-batch of a step after the first), only its own bucket was waited for
            later = sorted(b for b in order if b not in seen["layer0_bucket"])
            assert seen["at_layer0"][1] == later and seen["at_layer0"][2] == later


# ----------------------------------------------------------------- reads and writes between steps
def between_steps(rank: int, world: int) -> dict:
    """Replicated and overlapped runs side by side: user access, evaluation, checkpoint save mid-run (gathers in
    flight), load into an engine whose gathers are in flight, close."""
    out = {}
    for zero in (0, 1):
        groups = build_groups(ProcessGrid(2, 1, 1), rank)
        engine = _mlp(groups, zero, optimizer="adam", lr=1e-2)
        rec = {"losses": [], "evals": [], "in_flight": []}
        ex, ey = _rows(groups, 100, 2)
        for step in range(STEPS):
            rec["losses"].append(engine.train_step(*_rows(groups, step, 2)).loss)
            if zero:
                rec["in_flight"].append(len(engine.zero.gather.in_flight))
            if step == 0:  # the user reads the model: complete parameters
                rec["params"] = [p.detach().clone().numpy() for p in engine.parameters]
                if zero:
                    rec["in_flight_after_access"] = engine.zero.gather.in_flight
            if step == 1:  # saved with the gathers in flight
                saved = engine.state_for_checkpoint()
            rec["evals"].append(engine.evaluate(ex, ey, micro_batches=2))
        # A second engine, one step in (its gathers in flight), loads the mid-run state and goes on.
        other = _mlp(groups, zero, optimizer="adam", lr=1e-2)
        other.train_step(*_rows(groups, 7, 2))
        other.load_checkpoint_state(saved["weights"], saved["optimizer"], saved["scaler"])
        rec["resumed"] = [other.train_step(*_rows(groups, step, 2)).loss for step in range(2, STEPS)]
        other.close()
        _close(engine, groups)
        out[zero] = rec
    return out


def test_reads_between_steps_see_the_whole_updated_model():
    for out in run_ranks(2, between_steps, timeout=180):
        plain, sharded = out[0], out[1]
        assert sharded["in_flight"] == [DEPTH] * STEPS  # every step leaves its gathers in flight
        assert sharded["in_flight_after_access"] == []  # engine.parameters waited for them
        for got, want in zip(sharded["params"], plain["params"]):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
        assert sharded["losses"] == pytest.approx(plain["losses"], rel=1e-5)
        assert sharded["evals"] == pytest.approx(plain["evals"], rel=1e-5)
        assert sharded["resumed"] == pytest.approx(plain["losses"][2:], rel=1e-5)
        assert plain["resumed"] == pytest.approx(plain["losses"][2:], rel=1e-5)
