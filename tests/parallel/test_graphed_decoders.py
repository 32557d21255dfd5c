"""CUDA-graphed autograd stages (csrc/executor/graphed_autograd_stage.h) without a GPU: the GPT and the Llama
trained with their stages' F and B recorded and replayed by the host in place of CUDA graphs -- static buffers in
slots reused by micro-batches not in flight together, the last stage's loss multiplied by a device scalar, the
final-gradient announcements recorded at capture and made after every B -- must train bit for bit like the eager
stages, on 1 rank, pp 2 (1F1B and interleaved), tp 2 (with and without sequence parallelism), dp 2 (ZeRO-1, whose
gathers are waited for before each replay) and pp 2 x tp 2; under the zero-bubble schedules (zb1, zbv, dualpipev)
the replayed I leaves its weight-gradient stashes for the eager W, and a slot captured as I replays a dualpipev B
as its I with the stashes flushed at once; each stage keeps exactly as many slots as its action list has
micro-batches in flight at once (to the W after an I); and closing the engine frees every graph, though the run
still holds the programs (NCCL destroys no group whose collectives a living graph captured)."""
from __future__ import annotations

import pytest

from dist_utils import run_ranks
from decoder_graph_runs import compute_actions, train
from hybrid_engine.parallel.pipeline.graphs import slots

GRIDS = {
    "llama 1 rank": {},
    "gpt 1 rank tied": {"model": "gpt", "tied": True},
    "llama 1 rank bf16 AdamW": {"amp": "bf16", "optimizer": "adamw"},
    "llama 1 rank fp16 (the scale moves)": {"amp": "fp16"},
    "llama 1 rank fp8, its weights' forms cached": {"amp": "bf16", "optimizer": "adamw", "fp8": True},
}
TWO_RANK_GRIDS = {
    "llama pp2 1f1b": {"pp": 2},
    "llama pp2 1f1b fp8 (two slots share the cached forms)": {"pp": 2, "amp": "bf16", "fp8": True},
    "gpt pp2 interleaved tied": {"model": "gpt", "pp": 2, "schedule": "interleaved", "v": 2, "tied": True},
    "llama tp2": {"mp": 2},
    "gpt tp2 sequence parallel": {"model": "gpt", "mp": 2, "sp": True},
    "llama tp2 sequence parallel": {"mp": 2, "sp": True},
    "llama dp2 ZeRO-1": {"dp": 2, "zero": 1},
    "gpt pp2 zbv tied": {"model": "gpt", "pp": 2, "schedule": "zbv", "v": 2, "tied": True},
    "llama pp2 zb1": {"pp": 2, "schedule": "zb1"},
    "llama pp2 zbv bf16 AdamW": {"pp": 2, "schedule": "zbv", "v": 2, "amp": "bf16", "optimizer": "adamw"},
    "llama pp2 dualpipev (B and I in one slot)": {"pp": 2, "schedule": "dualpipev", "v": 2},
    "llama dp2 ZeRO-1 zb1": {"dp": 2, "zero": 1, "schedule": "zb1"},
}
ZERO_BUBBLE = ("zb1", "zbv", "dualpipev")
FOUR_RANK_GRIDS = {
    "llama pp2 x tp2 1f1b": {"pp": 2, "mp": 2},
    "gpt pp2 x tp2 interleaved": {"model": "gpt", "pp": 2, "mp": 2, "schedule": "interleaved", "v": 2},
}


def runs_of(grids: dict) -> list[dict]:
    return [dict(grid, graphs=graphs) for grid in grids.values() for graphs in ("host", "off")]


def check(grids: dict, per_rank: list[list[dict]]) -> None:
    for rank_runs in per_rank:
        for index, name in enumerate(grids):
            replayed, eager = rank_runs[2 * index], rank_runs[2 * index + 1]
            assert replayed["losses"] == eager["losses"] and replayed["scales"] == eager["scales"], name
            # the announcements each replay makes start the DP reductions as the eager backward's do
            assert replayed["launches"] == eager["launches"], name
            assert replayed["state"].keys() == eager["state"].keys(), name
            for key in eager["state"]:
                assert (replayed["state"][key] == eager["state"][key]).all(), (name, key)
            assert replayed["kinds"] == ["GraphedAutogradStage"] and eager["kinds"] == ["AutogradStage"], name
            m, steps = grids[name].get("m", 4), len(eager["losses"])
            compute = compute_actions(replayed)
            for (captures, replays, kept), (stage, slot_of) in zip(replayed["counts"],
                                                                  replayed["slot_of_micro"].items()):
                want = slots(compute, stage)
                # the first step eager in every slot, each later one replays every micro-batch's F and B
                assert kept == want and captures == 2 * want, (name, stage)
                assert replays == 2 * m * (steps - 1), (name, stage)
                assert sorted(set(slot_of)) == list(range(want)) and len(slot_of) == m, (name, stage)
            # the replayed I stashes its weight gradients for the W, as the eager I does; no B stashes any
            split = grids[name].get("schedule") in ZERO_BUBBLE
            assert all((stashed > 0) == split for stashed in replayed["stashed"]), (name, replayed["stashed"])
            # the engine's close freed every graph of the programs the run still held
            assert replayed["slots_after_close"] == [0] * len(replayed["counts"]), name



def test_replayed_decoder_stages_train_bit_for_bit_like_eager_ones_on_one_rank():
    [runs] = run_ranks(1, train, runs_of(GRIDS), timeout=300)
    check(GRIDS, [runs])
    # fp16 tests the device multiplier only if the scale moved between replays
    fp16 = runs[2 * list(GRIDS).index("llama 1 rank fp16 (the scale moves)")]
    assert len(set(fp16["scales"])) > 2, fp16["scales"]


def test_a_new_shape_runs_eagerly_and_is_captured_again_and_a_smaller_last_micro_batch_runs_beside_the_graphs():
    from decoder_graph_runs import train_changing_shapes

    [replayed], [eager] = (run_ranks(1, train_changing_shapes, graphs, timeout=120) for graphs in ("host", "off"))
    assert replayed["losses"] == eager["losses"]
    for key in eager["state"]:
        assert (replayed["state"][key] == eager["state"][key]).all(), key
    # (captures, replays) after each step: one slot; 4 rows captured at step 1, 2 rows at step 3, 4 rows again at
    # step 5 (step 4 ran all eagerly); from step 5 on the 3-row micro-batch runs eagerly and nothing is recaptured
    assert replayed["counts"] == [(0, 0), (2, 4), (2, 4), (4, 8), (4, 8), (6, 10), (6, 12)]


@pytest.mark.multiprocess
def test_replayed_decoder_stages_train_bit_for_bit_on_two_rank_grids():
    per_rank = run_ranks(2, train, runs_of(TWO_RANK_GRIDS), timeout=600)
    check(TWO_RANK_GRIDS, per_rank)
    dp2 = per_rank[0][2 * list(TWO_RANK_GRIDS).index("llama dp2 ZeRO-1")]
    assert all(any(cause == "notified" for _, cause in step) for step in dp2["launches"]), dp2["launches"]


@pytest.mark.multiprocess
def test_a_switch_from_1f1b_to_zb1_captures_the_new_schedules_i_afresh():
    from decoder_graph_runs import train_rescheduled

    replayed, eager = (run_ranks(2, train_rescheduled, graphs, timeout=120) for graphs in ("host", "off"))
    for r, e in zip(replayed, eager):
        assert r["losses"] == e["losses"]
        for key in e["state"]:
            assert (r["state"][key] == e["state"][key]).all(), key
        assert r["kinds"] == ["GraphedAutogradStage"] and e["kinds"] == ["AutogradStage"]
        # 1F1B's B stashes nothing; zb1's first step runs eagerly, the next two replay its I, which stash
        [before], [warm_up], [replayed_i], [again] = r["stashed"][1:]
        assert before == warm_up == 0 < replayed_i < again


@pytest.mark.multiprocess
def test_replayed_decoder_stages_train_bit_for_bit_on_pp2_x_tp2():
    check(FOUR_RANK_GRIDS, run_ranks(4, train, runs_of(FOUR_RANK_GRIDS), timeout=600))
