"""The GPT through the Engine: every grid reproduces a 1-rank engine run and an independent plain-PyTorch loop.

Tiny shapes (vocab 67: padded to 68 at mp=2; hidden 32, 4 heads, 4 blocks, seq 16), fp32, SGD with momentum (an
exact-match test: AdamW's normalisation turns rounding noise into lr-sized steps), 3 steps of 8 sequences in 4
micro-batches per DP rank. Grids are grouped by world size so each run_ranks call reuses its processes.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid, optim
from hybrid_engine.data import MarkovChain, TokenDataset, open_dataset
from hybrid_engine.models.gpt import GPTConfig, build_gpt, gpt_loss
from hybrid_engine.grid import build_groups
from hybrid_engine.workloads import gpt_workload

VOCAB, SEQ, BATCH, MICRO, STEPS, LR, MOMENTUM = 67, 16, 8, 4, 3, 0.1, 0.9
RTOL = 1e-5


def config(tied: bool) -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, layers=4, hidden=32, heads=4, seq_len=SEQ, tie_embeddings=tied, seed=3)


def dataset(vocab: int = VOCAB) -> TokenDataset:
    return TokenDataset(MarkovChain(5, vocab=vocab).sample(4096, 7), vocab, SEQ, seed=11)


def train_engine(rank: int, run: dict, steps: int = STEPS, data: TokenDataset | None = None):
    """(engine, groups, losses) of one run on this rank; the caller closes them."""
    data = data or dataset()
    workload = gpt_workload(config(run.get("tied", False)), data, sequence_parallel=run.get("sp", False),
                            recompute=run.get("recompute", "none"))
    pp, v = run.get("pp", 1), run.get("v", 1)
    groups = build_groups(ProcessGrid(run.get("dp", 1), pp, run.get("mp", 1)), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                         micro_batches=MICRO, virtual_stages=v, merge_weight_grads=run.get("merge", False),
                         optimizer=optim.SGD(LR, MOMENTUM), recompute=workload.full_recompute,
                         **workload.engine_kwargs(pp * v))
    per_dp = BATCH // groups.grid.dp_size
    dp = groups.coords.dp
    losses = []
    for step in range(run.get("first_step", 0), run.get("first_step", 0) + steps):
        x, y = workload.draw(step, dp * per_dp, (dp + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage)
        losses.append(engine.train_step(x, y).loss)
    return engine, groups, losses


def _close(engine, groups) -> None:
    engine.close()
    groups.destroy()
    dist.barrier()


def train_grids(rank: int, world: int, runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        engine, groups, losses = train_engine(rank, run)
        state = {k: t.numpy() for k, t in engine.full_state_dict().items()}
        programs = [p.describe() for p in engine.stage_programs.values()]
        _close(engine, groups)
        out.append({"losses": losses, "state": state, "programs": programs})
    return out


def reference(tied: bool, steps: int = STEPS) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch: the dense GPT (tied: one Parameter used by the embedding and the head), SGD with momentum,
    the global batch in BATCH / MICRO-row micro-batches, each loss divided by their count."""
    torch.set_num_threads(1)
    cfg, data = config(tied), dataset()
    model = build_gpt(cfg)
    if tied:
        model[-1].lm_head.weight = model[0].word
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(steps):
        x, y = data.batch(step, BATCH)
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(BATCH // 2), y.chunk(BATCH // 2)):
            loss = gpt_loss(model(xm), ym) / (BATCH // 2)
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if tied:
        state[f"{cfg.layers + 1}.lm_head.weight"] = state["0.word"]
    return losses, state


def merged_state(results: list[dict]) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for r in results:
        for k, v in r["state"].items():
            state[k] = torch.from_numpy(v)
    return state


def assert_matches(losses, state, ref_losses, ref_state, what: str) -> None:
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= RTOL * abs(b), f"{what}: step {step} loss {a} vs {b}"
    assert set(state) == set(ref_state), f"{what}: parameters {sorted(set(state) ^ set(ref_state))}"
    for name, ref in ref_state.items():
        err = (state[name] - ref).norm() / ref.norm().clamp_min(1e-12)
        assert err <= RTOL, f"{what}: {name} relative error {err:.2e}"


GRIDS_2 = {
    "pp2 1f1b": {"pp": 2},
    "pp2 1f1b tied": {"pp": 2, "tied": True},
    "pp2 zb1 merged W tied": {"pp": 2, "schedule": "zb1", "merge": True, "tied": True},
    "pp2 interleaved v2 tied": {"pp": 2, "schedule": "interleaved", "v": 2, "tied": True},
    "mp2": {"mp": 2},
    "mp2 sequence parallel tied": {"mp": 2, "sp": True, "tied": True},
    "dp2 tied": {"dp": 2, "tied": True},
    "pp2 full recompute tied": {"pp": 2, "recompute": "full", "tied": True},
    "mp2 sp selective recompute": {"mp": 2, "sp": True, "recompute": "selective"},
}
GRIDS_8 = {
    "dp2 pp2 mp2 sequence parallel tied": {"dp": 2, "pp": 2, "mp": 2, "sp": True, "tied": True},
}
GRIDS_1 = {"1 rank": {}, "1 rank tied": {"tied": True}}


@pytest.fixture(scope="module")
def references():
    return {tied: reference(tied) for tied in (False, True)}


@pytest.fixture(scope="module")
def one_rank():
    results = run_ranks(1, train_grids, list(GRIDS_1.values()), timeout=120)[0]
    return {run.get("tied", False): r for run, r in zip(GRIDS_1.values(), results)}


def test_one_rank_engine_matches_plain_pytorch(one_rank, references):
    for tied in (False, True):
        r = one_rank[tied]
        assert_matches(r["losses"], merged_state([r]), *references[tied], f"1 rank tied={tied}")
    assert all("autograd" in p for p in one_rank[False]["programs"])


@pytest.mark.parametrize("world, grids", [(2, GRIDS_2), (8, GRIDS_8)], ids=["2 ranks", "8 ranks"])
def test_every_grid_matches_one_rank_and_plain_pytorch(world, grids, one_rank, references):
    results = run_ranks(world, train_grids, list(grids.values()), timeout=600)
    for i, (name, run) in enumerate(grids.items()):
        per_rank = [r[i] for r in results]
        losses, state = per_rank[0]["losses"], merged_state(per_rank)
        tied = run.get("tied", False)
        assert all(r["losses"] == losses for r in per_rank), f"{name}: ranks disagree on the loss"
        base = one_rank[tied]
        assert_matches(losses, state, base["losses"], merged_state([base]), f"{name} vs 1 rank")
        assert_matches(losses, state, *references[tied], f"{name} vs plain PyTorch")
        if tied:  # the two copies stay equal
            assert torch.equal(state["0.word"], state["5.lm_head.weight"]), name
