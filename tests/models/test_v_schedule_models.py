"""The GPT and the Llama under the V schedules (zbv, dualpipev) on pp2 and pp4 train what one rank trains (fp32,
CPU, relative 1e-5), beside DP, tensor parallelism (with sequence parallelism), ZeRO-1, full and selective
recompute, merged W, tied embeddings and compiled stages; fp16 half weights with the dynamic loss scaler stay close to
fp32.

Tiny shapes as in test_gpt_engine.py / test_llama_grids.py but 6 blocks, so pp4's eight V stages each get a module
(embedding, 6 blocks, head); 16 sequences in 8 micro-batches (dualpipev needs 2 pp; one sequence each under dp2),
3 steps of SGD with momentum.
One run_ranks call of 4 ranks sweeps every grid of both models; one of 1 rank gives the baselines."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.workload import gpt_workload
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.workload import llama_workload
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.grid import build_groups

VOCAB, SEQ, BATCH, MICRO, STEPS, LR, MOMENTUM = 67, 16, 16, 8, 3, 0.1, 0.9
RTOL = 1e-5


def _workload(run: dict):
    data = TokenDataset(MarkovChain(5, vocab=VOCAB).sample(4096, 7), VOCAB, SEQ, seed=11)
    tied, sp, recompute = run.get("tied", False), run.get("sp", False), run.get("recompute", "none")
    if run["model"] == "gpt":
        cfg = GPTConfig(vocab_size=VOCAB, layers=6, hidden=32, heads=4, seq_len=SEQ, tie_embeddings=tied, seed=3)
        return gpt_workload(cfg, data, sequence_parallel=sp, recompute=recompute)
    cfg = LlamaConfig(VOCAB, 6, 32, 4, 2, 48, SEQ, tie_embeddings=tied, rope_theta=500.0, seed=3)
    return llama_workload(cfg, data, sequence_parallel=sp, recompute=recompute, vocab_from_data=False)


def train(rank: int, world: int, runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        workload = _workload(run)
        dp, pp, mp = run.get("grid", (1, 1, 1))
        v = 2 if pp > 1 else 1
        groups = build_groups(ProcessGrid(dp, pp, mp), rank)
        engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                             micro_batches=MICRO, virtual_stages=v, merge_weight_grads=run.get("merge", False),
                             optimizer=optim.SGD(LR, MOMENTUM), recompute=workload.full_recompute,
                             amp=run.get("amp", "off"), zero=run.get("zero", 0),
                             stage_compile=run.get("compile", False),
                             **workload.engine_kwargs(pp * v))
        per_dp = BATCH // dp
        d = groups.coords.dp
        losses = []
        for step in range(STEPS):
            x, y = workload.draw(step, d * per_dp, (d + 1) * per_dp, inputs=engine.holds_first_stage,
                                 targets=engine.holds_last_stage)
            losses.append(engine.train_step(x, y).loss)
        full = engine.full_state_dict()  # every rank joins (ZeRO-1 gathers its shards)
        state = {k: t.float().numpy() for k, t in full.items()} if d == 0 else {}
        engine.close()
        groups.destroy()
        dist.barrier()
        out.append({"losses": losses, "state": state})
    return out


# grid (dp, pp, mp); every run on 4 ranks
RUNS_4 = {
    "gpt pp4 zbv tied": {"model": "gpt", "grid": (1, 4, 1), "schedule": "zbv", "tied": True},
    "gpt pp4 dualpipev": {"model": "gpt", "grid": (1, 4, 1), "schedule": "dualpipev"},
    "gpt pp2 tp2 sp zbv merged W tied": {"model": "gpt", "grid": (1, 2, 2), "schedule": "zbv", "sp": True,
                                          "merge": True, "tied": True},
    "gpt dp2 pp2 dualpipev zero1 full recompute tied": {"model": "gpt", "grid": (2, 2, 1), "schedule": "dualpipev",
                                                        "zero": 1, "recompute": "full", "tied": True},
    "llama pp4 dualpipev tied": {"model": "llama", "grid": (1, 4, 1), "schedule": "dualpipev", "tied": True},
    "llama pp4 zbv selective recompute": {"model": "llama", "grid": (1, 4, 1), "schedule": "zbv",
                                          "recompute": "selective"},
    "llama dp2 pp2 zbv zero1": {"model": "llama", "grid": (2, 2, 1), "schedule": "zbv", "zero": 1},
    "llama pp2 tp2 dualpipev": {"model": "llama", "grid": (1, 2, 2), "schedule": "dualpipev"},
}
# torch.compile'd stages (inductor, CPU) on 2 ranks: the compiled graph computes the weight gradients in I, so W has
# nothing left to run, and the result is the eager one's
COMPILED_2 = {"llama pp2 zbv compiled": {"model": "llama", "grid": (1, 2, 1), "schedule": "zbv", "compile": True}}
HALF_4 = {"gpt dp2 pp2 zbv fp16 tied": {"model": "gpt", "grid": (2, 2, 1), "schedule": "zbv", "amp": "fp16",
                                        "tied": True}}


def _key(run: dict) -> tuple:
    return run["model"], run.get("tied", False)


def test_v_schedules_train_the_one_rank_model():
    baselines = [{"model": m, "tied": t} for m in ("gpt", "llama") for t in (False, True)]
    one_rank = dict(zip(map(_key, baselines), run_ranks(1, train, baselines, timeout=300)[0]))
    results = run_ranks(4, train, list(RUNS_4.values()) + list(HALF_4.values()), timeout=600)
    compiled = run_ranks(2, train, list(COMPILED_2.values()), timeout=600)
    results = [r4 + (compiled[r] if r < 2 else []) for r, r4 in enumerate(results)]
    for i, (name, run) in enumerate(list(RUNS_4.items()) + list(HALF_4.items()) + list(COMPILED_2.items())):
        base = one_rank[_key(run)]
        state = {}
        for r in results[:2] if name in COMPILED_2 else results:
            assert r[i]["losses"] == results[0][i]["losses"], f"{name}: ranks disagree on the loss"
            state.update({k: torch.from_numpy(v) for k, v in r[i]["state"].items()})
        losses = results[0][i]["losses"]
        if name in HALF_4:
            for a, b in zip(losses, base["losses"]):
                assert abs(a - b) <= 3e-2 * b, f"{name}: loss {a} vs fp32 {b}"
            assert losses[-1] < losses[0], name
            continue
        for step, (a, b) in enumerate(zip(losses, base["losses"])):
            assert abs(a - b) <= RTOL * abs(b), f"{name}: step {step} loss {a} vs {b}"
        assert set(state) == set(base["state"]), name
        for key, ref in base["state"].items():
            ref = torch.from_numpy(ref)
            err = float((state[key] - ref).norm() / ref.norm().clamp_min(1e-12))
            assert err <= RTOL, f"{name}: {key} relative error {err:.2e}"
