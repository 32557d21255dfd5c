"""Pipeline stages that end inside a transformer block (parallel/pipeline/units.py): the layout rule, the halves
themselves, and training on grids whose stages cut blocks, against one rank.

A half keeps the block's parameter names and initial weights, and two halves in a row compute what the block
computes, bit for bit. The GPT and the Llama train on pp2 (1F1B, and zbv's V, whose two middle stages a rank
holds both), pp2 x tp2 with sequence parallelism and zb1's split backward (also with the fused kernels and fp8's
emulated GEMMs), every stage boundary inside a block, as one rank trains them (fp32, SGD with momentum: relative
1e-5); a state saved by one rank loads into a split layout and continues the same curve. Tiny shapes: hidden 32,
4 heads, 4 blocks, seq 16, 3 steps of 8 sequences in 4 micro-batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.config.engine import ConfigError, StageConfig
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.kernels.options import KernelOptions
from hybrid_engine.models import registry
from hybrid_engine.models import materialize
from hybrid_engine.models.gpt.model import GPTConfig, dense_gpt, half_costs, layer_costs
from hybrid_engine.models.gpt.parallelize import parallelize_gpt
from hybrid_engine.models.gpt.workload import gpt_workload
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.workload import llama_workload
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.parallel.pipeline.units import AUTO_GAIN, Half, LayoutRule, place, unit_sequence
from hybrid_engine.train.cli import parse_config

VOCAB, SEQ, BATCH, MICRO, LR, MOMENTUM = 67, 16, 8, 4, 0.1, 0.9
RTOL = 1e-5
# The GPT-1B of the pp4 schedule pass: hidden 2560, 12 blocks, 20 heads, seq 1024, vocabulary 32000.
GPT_PP4 = GPTConfig(32000, 12, 2560, 20, 1024)


def tiny_gpt() -> GPTConfig:
    return GPTConfig(VOCAB, 4, 32, 4, SEQ, seed=3)


def tiny_llama() -> LlamaConfig:
    return LlamaConfig(VOCAB, 4, 32, 4, 2, 48, SEQ, rope_theta=500.0, seed=3)


def dataset() -> TokenDataset:
    return TokenDataset(MarkovChain(5, vocab=VOCAB).sample(4096, 7), VOCAB, SEQ, seed=11)


def rank_loads(layout, costs, shares, pp, placement):
    import hybrid_engine._C as _C
    loads = [0.0] * pp
    for s, stage in enumerate(layout):
        rank = _C.schedule.stage_rank(s, pp, len(layout), placement)
        loads[rank] += sum(costs[u] if isinstance(u, int) else costs[u.module] * shares[u.part] for u in stage)
    return loads


@pytest.mark.parametrize("num_stages, placement, whole_worst, split_worst", [(8, "v", 1.23, 1.04),
                                                                              (4, "loop", 1.23, 1.11)])
def test_the_gpt_pp4_rank_work_evens_out_with_blocks_cut(num_stages, placement, whole_worst, split_worst):
    """Whole blocks leave the GPT's busiest pp4 rank 1.23x the mean (13 blocks' worth over 4 ranks); cut between
    halves it is within a few percent, and auto takes that cut."""
    costs, shares = layer_costs(GPT_PP4), half_costs(GPT_PP4)
    halves = {i: ("attention", "mlp") for i in range(1, GPT_PP4.layers + 1)}
    named = dict(zip(("attention", "mlp"), shares))
    whole = place(costs, halves, shares, num_stages, 4, placement, "off")
    split = place(costs, halves, shares, num_stages, 4, placement, "auto")
    assert not any(isinstance(u, Half) for stage in whole for u in stage)
    assert any(isinstance(u, Half) for stage in split for u in stage)
    mean = sum(costs) / 4
    assert max(rank_loads(whole, costs, named, 4, placement)) / mean == pytest.approx(whole_worst, abs=0.01)
    assert max(rank_loads(split, costs, named, 4, placement)) / mean <= split_worst
    # every module once, in order; a cut block's two halves on consecutive stages
    flat = [u for stage in split for u in stage]
    assert [u if isinstance(u, int) else u.module for u in flat if not isinstance(u, Half) or u.part == "mlp"] \
        == list(range(len(costs)))


def test_auto_keeps_whole_blocks_where_halves_gain_too_little():
    costs = [0.02, 1.0, 1.0, 1.0, 1.0, 0.5]  # 4 blocks and a light head over 2 stages: 2.02 | 2.5 either way
    halves = {i: ("attention", "mlp") for i in range(1, 5)}
    whole = place(costs, halves, (0.5, 0.5), 2, 2, "loop", "off")
    assert place(costs, halves, (0.5, 0.5), 2, 2, "loop", "auto") == whole
    assert AUTO_GAIN > 0


def test_halves_keep_the_block_names_weights_and_output():
    cfg = tiny_gpt()
    whole = materialize(parallelize_gpt(dense_gpt(cfg, "meta"), None), "cpu")
    layout = [[0, 1, Half(2, "attention")], [Half(2, "mlp"), 3, 4, 5]]
    units, positions, module_index = unit_sequence(dense_gpt(cfg, "meta"), layout)
    assert positions == [[0, 1, 2], [3, 4, 5, 6]] and module_index == [0, 1, 2, 2, 3, 4, 5]
    stages = [materialize(parallelize_gpt(nn.Sequential(*[units[u] for u in stage]), None), "cpu")
              for stage in positions]
    names = {}
    for stage, units_of in zip(stages, positions):
        for name, p in stage.named_parameters():
            local, _, leaf = name.partition(".")
            names[f"{module_index[units_of[int(local)]]}.{leaf}"] = p
    reference = dict(whole.named_parameters())
    assert set(names) == set(reference)
    assert all(torch.equal(names[n], reference[n]) for n in names)  # drawn from the block's own generator
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    assert torch.equal(stages[1](stages[0](tokens)), whole(tokens))


def test_a_layout_must_name_a_split_block_by_its_halves_only():
    with pytest.raises(ValueError, match="halves only"):
        unit_sequence(dense_gpt(tiny_gpt(), "meta"), [[0, 1, 2, Half(2, "attention")], [Half(2, "mlp"), 3, 4, 5]])
    with pytest.raises(ValueError, match="no residual halves"):
        unit_sequence(dense_gpt(tiny_gpt(), "meta"), [[Half(0, "attention"), 1, 2], [3, 4, 5]])


def test_split_blocks_on_is_refused_for_a_model_without_halves_and_kept_for_the_decoders():
    with pytest.raises(ConfigError, match="--split-blocks on applies to --model gpt and llama only"):
        parse_config(["--split-blocks", "on", "--pp", "2", "--depth", "4"]).validate(2, "cpu", registry.check_model)
    cfg = parse_config(["--model", "gpt", "--layers", "3", "--split-blocks", "on", "--pp", "2"])
    cfg.validate(2, "cpu", registry.check_model)
    assert registry.build_workload(cfg).layout_fn.mode == "on"
    assert StageConfig().split_blocks == "auto"
    with pytest.raises(ConfigError, match="stages.split_blocks"):
        StageConfig(split_blocks="maybe").validate()


def test_the_layout_line_names_the_cut_blocks():
    rule = LayoutRule.of(dense_gpt(GPT_PP4, "meta"), layer_costs(GPT_PP4), half_costs(GPT_PP4), "auto")
    line = rule.describe(8, 4, "v")
    assert line.startswith("stages end inside modules ") and "1.23x with whole blocks" in line
    assert LayoutRule.of(dense_gpt(GPT_PP4, "meta"), layer_costs(GPT_PP4), half_costs(GPT_PP4), "off"
                         ).describe(8, 4, "v") is None


# Every stage boundary inside a block (modules: 0 the embedding, 1-4 the blocks, 5 the head), by stage count.
LAYOUTS = {1: None,
           2: [[0, 1, 2, Half(3, "attention")], [Half(3, "mlp"), 4, 5]],
           4: [[0, 1, Half(2, "attention")], [Half(2, "mlp"), Half(3, "attention")], [Half(3, "mlp"), Half(4, "attention")],
               [Half(4, "mlp"), 5]]}
# (model, dp x pp x mp, schedule, virtual stages, sequence parallel)
SPLIT_RUNS = {
    "gpt_pp2_1f1b": ("gpt", (1, 2, 1), "1f1b", 1, False),
    "gpt_pp2_zbv": ("gpt", (1, 2, 1), "zbv", 2, False),
    "llama_pp2_zb1": ("llama", (1, 2, 1), "zb1", 1, False),
    # the fused kernels' CPU forms and fp8's emulated GEMMs in each half, against one rank with the same kernels
    "llama_fp8_pp2_zb1": ("llama_fp8", (1, 2, 1), "zb1", 1, False),
}
SPLIT_RUNS_4 = {
    "llama_pp2_tp2_sp": ("llama", (1, 2, 2), "1f1b", 1, True),
    "gpt_dp2_pp2": ("gpt", (2, 2, 1), "interleaved", 2, False),
}


def _workload(model: str, sp: bool):
    if model == "gpt":
        return gpt_workload(tiny_gpt(), dataset(), sequence_parallel=sp, split_blocks="on")
    kernels = KernelOptions(fused=True, fp8="rowwise") if model == "llama_fp8" else KernelOptions()
    return llama_workload(tiny_llama(), dataset(), sequence_parallel=sp, vocab_from_data=False, split_blocks="on",
                          kernels=kernels)


def _train(rank: int, model: str, grid, schedule: str, v: int, sp: bool, steps: range, load=None):
    workload = _workload(model, sp)
    dp, pp, mp = grid
    groups = build_groups(ProcessGrid(dp, pp, mp), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, schedule=schedule, micro_batches=MICRO,
                         virtual_stages=v, optimizer=optim.SGD(LR, MOMENTUM), parallelize=workload.parallelize,
                         layout=LAYOUTS[pp * v])
    if load is not None:
        load = _tensors(load)
        engine.load_checkpoint_state(load["weights"], load["optimizer"], load["scaler"])
    per_dp = BATCH // dp
    losses = []
    for step in steps:
        x, y = workload.draw(step, groups.coords.dp * per_dp, (groups.coords.dp + 1) * per_dp,
                             inputs=engine.holds_first_stage, targets=engine.holds_last_stage)
        losses.append(engine.train_step(x, y).loss)
    state = _arrays(engine.state_for_checkpoint())  # tensors would cross to the parent as shared memory
    engine.close()
    groups.destroy()
    dist.barrier()
    return losses, state


def _arrays(value):
    if torch.is_tensor(value):
        return value.detach().float().numpy() if value.is_floating_point() else value.numpy()
    if isinstance(value, dict):
        return {k: _arrays(v) for k, v in value.items()}
    return value


def _tensors(value):
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    return value


def train_runs(rank: int, world: int, runs: list[tuple]) -> list[tuple]:
    out = []
    for model, grid, schedule, v, sp in runs:
        losses, state = _train(rank, model, grid, schedule, v, sp, range(3))
        out.append((losses, state["weights"]))
    return out


def one_rank(rank: int, world: int, models: list[str]) -> dict:
    out = {}
    for model in models:
        losses, state = _train(rank, model, (1, 1, 1), "1f1b", 1, False, range(3))
        _, after_two = _train(rank, model, (1, 1, 1), "1f1b", 1, False, range(2))
        out[model] = (losses, state["weights"], after_two)
    return out


def resume_split(rank: int, world: int, loads: dict) -> dict:
    """Step 2 of each model on a split pp2 layout, from the one-rank state after steps 0 and 1."""
    return {model: _train(rank, model, (1, 2, 1), "1f1b", 1, False, range(2, 3), load)[0]
            for model, load in loads.items()}


@pytest.fixture(scope="module")
def references():
    return run_ranks(1, one_rank, ["gpt", "llama", "llama_fp8"], timeout=300)[0]


def _check(result, reference):
    losses, state = result
    ref_losses, ref_state, _ = reference
    assert losses == pytest.approx(ref_losses, rel=RTOL)
    assert set(state) == set(ref_state)
    for name, tensor in state.items():
        np.testing.assert_allclose(tensor, ref_state[name], rtol=RTOL, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("world, runs", [(2, SPLIT_RUNS), (4, SPLIT_RUNS_4)], ids=["2 ranks", "4 ranks"])
def test_grids_with_blocks_cut_train_as_one_rank(world, runs, references):
    results = run_ranks(world, train_runs, list(runs.values()), timeout=600)
    for k, name in enumerate(runs):
        state = {}
        for rank_result in results:  # each rank's stages (over MP: the full tensors, the same on each)
            state.update(rank_result[k][1])
        _check((results[0][k][0], state), references[runs[name][0]])


def test_a_one_rank_state_loads_into_a_split_layout_and_continues_the_curve(references):
    loads = {model: ref[2] for model, ref in references.items() if model != "llama_fp8"}  # one rank's whole state
    resumed = run_ranks(2, resume_split, loads, timeout=300)[0]
    for model, losses in resumed.items():
        assert losses == pytest.approx(references[model][0][2:], rel=RTOL)
