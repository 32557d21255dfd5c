"""Grid invariance: every schedule on every grid with dp*pp*mp <= 8 reproduces the single-process loss curve
and final weights (fp32, CPU, relative 1e-5), against an independent plain-PyTorch reference."""
import itertools

import pytest
import torch

from dist_utils import run_ranks
from engine_ranks import sweep
from engine_reference import reference_run

# batch 3360 = 4 micro-batches x lcm(1..8): every dp <= 8 gets equal slices
CFG = dict(dim=64, depth=8, batch_size=3360, micro_batches=4, steps=5, lr=0.05)
# The sweep of one world size takes a batch of 8 rows per micro-batch of its largest dp (every dp of `world` ranks
# divides it), checked against the plain-PyTorch run of that batch: the grids agree (or not) whatever the batch,
# and 3360 rows cost the sweeps a sixth of their CPU
ROWS = 8
PIPELINE_SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb1")


def runs_for_world(world: int) -> list[tuple]:
    runs = []
    for dp, pp, mp in itertools.product(range(1, world + 1), repeat=3):
        if dp * pp * mp != world or CFG["dim"] % mp:  # dim must split evenly over MP ranks
            continue
        if pp == 1:
            runs.append((dp, pp, mp, "1f1b", 1))
            continue
        for schedule in PIPELINE_SCHEDULES:
            v = 2 if schedule == "interleaved" else 1
            if CFG["depth"] < pp * v or (schedule == "interleaved" and CFG["micro_batches"] % pp):
                continue
            runs.append((dp, pp, mp, schedule, v))
    return runs


@pytest.fixture(scope="module")
def references():
    """batch size -> the plain-PyTorch run of CFG at that batch (losses, final state), each computed once."""
    cache = {}

    def of(batch_size: int) -> tuple:
        if batch_size not in cache:
            cache[batch_size] = reference_run(CFG["dim"], CFG["depth"], batch_size, CFG["micro_batches"],
                                              CFG["steps"], CFG["lr"])
        return cache[batch_size]

    return of


@pytest.fixture(scope="module")
def reference(references):
    return references(CFG["batch_size"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("world", range(1, 9))
def test_every_grid_and_schedule_matches_single_process(world, references):
    cfg = dict(CFG, batch_size=CFG["micro_batches"] * world * ROWS)
    ref_losses, ref_state = references(cfg["batch_size"])
    runs = runs_for_world(world)
    if not runs:
        pytest.skip(f"no grid of {world} ranks fits depth {CFG['depth']}")
    results = run_ranks(world, sweep, runs, cfg, timeout=300)
    for index, run in enumerate(runs):
        per_rank = [results[r][index] for r in range(world)]
        for r, out in enumerate(per_rank):
            assert out["losses"] == pytest.approx(ref_losses, rel=1e-5), (run, r)
        state = {}
        for out in per_rank:
            state.update({k: torch.from_numpy(v) for k, v in out["state"].items()})
        assert set(state) == set(ref_state), run
        worst = max(_rel(state[k], ref_state[k]) for k in ref_state)
        assert worst < 1e-5, (run, worst)


def test_merged_weight_gradients_match_single_process(reference):
    """zb1 with every stage's W merged into one GEMM per layer (which then overwrites the gradient buffers
    instead of zeroing and accumulating) trains the same model."""
    ref_losses, ref_state = reference
    runs = [(2, 2, 1, "zb1", 1), (1, 4, 1, "zb1", 1), (4, 1, 1, "zb1", 1), (1, 2, 2, "zb1", 1)]
    results = run_ranks(4, sweep, runs, dict(CFG, merge_weight_grads=True), timeout=300)
    for index, run in enumerate(runs):
        state = {}
        for r in range(4):
            assert results[r][index]["losses"] == pytest.approx(ref_losses, rel=1e-5), (run, r)
            state.update({k: torch.from_numpy(v) for k, v in results[r][index]["state"].items()})
        assert max(_rel(state[k], ref_state[k]) for k in ref_state) < 1e-5, run


def test_lookahead_trains_the_same_model(reference):
    """Extra warm-up forwards (1f1b and zb1, merged W too) change only the order of work, not the result; with
    4 micro-batches a lookahead of 3 on pp=2 makes rank 0 run every forward first."""
    ref_losses, ref_state = reference
    for cfg, runs in ((dict(CFG, lookahead=1), [(1, 4, 1, "1f1b", 1), (2, 2, 1, "zb1", 1)]),
                      (dict(CFG, lookahead=3, merge_weight_grads=True), [(1, 2, 2, "zb1", 1), (2, 2, 1, "1f1b", 1)])):
        results = run_ranks(4, sweep, runs, cfg, timeout=300)
        for index, run in enumerate(runs):
            state = {}
            for r in range(4):
                assert results[r][index]["losses"] == pytest.approx(ref_losses, rel=1e-5), (run, r)
                state.update({k: torch.from_numpy(v) for k, v in results[r][index]["state"].items()})
            assert max(_rel(state[k], ref_state[k]) for k in ref_state) < 1e-5, (run, cfg["lookahead"])


@pytest.mark.parametrize("stage_impl", ["auto", "autograd"])
def test_stages_handed_on_within_a_rank_and_looped_gpipe(reference, stage_impl):
    """Several stages per rank outside interleaved: gpipe's looped order over 2 and 3 chunks on pp=2 (the last rank
    hands its chunk's output back to rank 0 on the ring), and pp=1 with 2 stages, where the hand-off from stage 0
    to stage 1 never leaves the rank (no channel: the executor passes the output on and the gradient back), through
    the native chains and through autograd."""
    ref_losses, ref_state = reference
    for world, runs in ((1, [(1, 1, 1, "gpipe", 2)]), (2, [(1, 2, 1, "gpipe", 2), (1, 2, 1, "gpipe", 3)])):
        results = run_ranks(world, sweep, runs, dict(CFG, stage_impl=stage_impl), timeout=300)
        for index, run in enumerate(runs):
            state = {}
            for r in range(world):
                assert results[r][index]["losses"] == pytest.approx(ref_losses, rel=1e-5), (run, r)
                state.update({k: torch.from_numpy(v) for k, v in results[r][index]["state"].items()})
            assert max(_rel(state[k], ref_state[k]) for k in ref_state) < 1e-5, run
