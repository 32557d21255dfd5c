"""Context parallelism on every axis, against one process: the GPT and the Llama with cp 2 and 4, alone and beside
tp 2 (sequence parallel inside a cp chunk), pp 2 (micro-batches of chunks, 1f1b, interleaved and zb1), dp 2 and
ZeRO-1, selective and full recompute, ring and all-gather attention, train what plain PyTorch trains on one process
(fp32, CPU: loss and weights after SGD with momentum, which carry the gradients, to relative 1e-5); bf16 close to
it. A checkpoint written on cp 2 x dp 2 loads on cp 4 and on dp 4 with the same weights, and the step after it
gives the same loss on both (cp shards no parameter: the copies are equal).

Tiny shapes (vocab 61, hidden 32, 4 heads (the Llama 2 kv heads: only they travel), 2 blocks, seq 16), 2 steps of
8 sequences in 2 micro-batches per DP rank. One run_ranks call per world size sweeps all of its runs."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid, checkpoint
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.models.decoder import next_token_loss
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.parallelize import build_gpt
from hybrid_engine.models.gpt.workload import gpt_workload
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.parallelize import build_llama
from hybrid_engine.models.llama.workload import llama_workload
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.grid import build_groups

VOCAB, SEQ, BATCH, MICRO, STEPS, LR, MOMENTUM = 61, 16, 8, 2, 2, 0.1, 0.9
RTOL = 1e-5


def config(model: str):
    if model == "gpt":
        return GPTConfig(VOCAB, 2, 32, 4, SEQ, seed=3)
    return LlamaConfig(VOCAB, 2, 32, 4, 2, 48, SEQ, rope_theta=500.0, seed=3)


def dataset() -> TokenDataset:
    return TokenDataset(MarkovChain(5, vocab=VOCAB).sample(4096, 7), VOCAB, SEQ, seed=11)


def _engine(rank: int, run: dict):
    model = run["model"]
    kw = dict(sequence_parallel=run.get("sp", False), recompute=run.get("recompute", "none"),
              split_blocks=run.get("split", "auto"))
    workload = (gpt_workload(config(model), dataset(), **kw) if model == "gpt"
                else llama_workload(config(model), dataset(), vocab_from_data=False, **kw))
    dp, cp, pp, mp = run["grid"]
    v = run.get("v", 1)
    groups = build_groups(ProcessGrid(dp, pp, mp, cp=cp), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                         micro_batches=MICRO, virtual_stages=v, optimizer=optim.SGD(LR, MOMENTUM),
                         recompute=workload.full_recompute, amp=run.get("amp", "off"), zero=run.get("zero", 0),
                         clip_grad=run.get("clip", 0.0),
                         cp_comm=run.get("comm", "ring"), trace=run.get("trace", False),
                         **workload.engine_kwargs(pp * v))
    return engine, groups, workload


def _train(engine, groups, workload, first: int, steps: int) -> list[float]:
    per_dp, dp = BATCH // groups.grid.dp_size, groups.coords.dp
    chunks = (groups.coords.cp, groups.grid.cp_size)
    out = []
    for step in range(first, first + steps):
        x, y = workload.draw(step, dp * per_dp, (dp + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage, chunks=chunks)
        out.append(engine.train_step(x, y).loss)
    return out


def sweep(rank: int, world: int, runs: list[dict]) -> list[dict]:
    """Each run trains STEPS steps (after loading run["load"] if given) and returns its losses and full state; with
    run["save"] it saves its state there."""
    torch.set_num_threads(1)
    results = []
    for run in runs:
        engine, groups, workload = _engine(rank, run)
        first = 0
        if "load" in run:
            first = checkpoint.load(engine, checkpoint.open_checkpoint(run["load"]))
            loaded = engine.full_state_dict()
        out = {"losses": _train(engine, groups, workload, first, run.get("steps", STEPS))}
        if run.get("trace"):  # the last step's CP transfers, as --trace draws them
            out["cp_spans"] = [(s.kind, s.bucket) for s in engine.comm_trace if s.axis == "cp"]
        first_copy = groups.coords.dp == 0 and groups.coords.cp == 0  # each pipeline rank's stages, once
        if "load" in run:
            out["loaded"] = {k: v.float().numpy() for k, v in loaded.items()} if first_copy else {}
        state = engine.full_state_dict()
        out["state"] = {k: v.float().numpy() for k, v in state.items()} if first_copy else {}
        if "save" in run:
            checkpoint.save(engine, run["save"], STEPS, {"model": workload.checkpoint_model, "optimizer": "sgd"})
        engine.close()
        groups.destroy()
        dist.barrier()
        results.append(out)
    return results


def reference(model: str, steps: int = STEPS, clip: float = 0.0) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch on one process: the dense model, SGD with momentum, the batch in micro-batches of the DP
    replicas' size whose losses are divided by their count; clip: the global gradient norm clipped to it."""
    torch.set_num_threads(1)
    cfg = config(model)
    net = build_gpt(cfg) if model == "gpt" else build_llama(cfg)
    data = dataset()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(steps):
        x, y = data.batch(step, BATCH)
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
            loss = next_token_loss(net(xm), ym) / MICRO
            loss.backward()
            total += loss.item()
        if clip:
            assert torch.nn.utils.clip_grad_norm_(net.parameters(), clip) > clip  # it does clip
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in net.state_dict().items()}


# grid: (dp, cp, pp, mp)
TRAIN_2 = [dict(model="llama", grid=(1, 2, 1, 1)), dict(model="gpt", grid=(1, 2, 1, 1), comm="all-gather")]
TRAIN_4 = [
    dict(model="llama", grid=(1, 4, 1, 1)),
    dict(model="gpt", grid=(1, 4, 1, 1), comm="all-gather", recompute="selective"),
    dict(model="llama", grid=(1, 2, 1, 2), sp=True, recompute="selective"),
    dict(model="gpt", grid=(1, 2, 1, 2), sp=True),
    dict(model="gpt", grid=(1, 2, 2, 1), schedule="interleaved", v=2, trace=True, split="off"),  # a block a rank
    dict(model="llama", grid=(1, 2, 2, 1), schedule="zb1", comm="all-gather"),
    dict(model="llama", grid=(2, 2, 1, 1), zero=1, save="cp2dp2"),
    dict(model="gpt", grid=(2, 2, 1, 1), recompute="full"),
    # the clipping norm agrees over cp (the gradients are summed over dp x cp before it), with and without ZeRO-1
    dict(model="gpt", grid=(1, 2, 1, 2), sp=True, clip=0.05),
    dict(model="llama", grid=(2, 2, 1, 1), zero=1, clip=0.05),
    dict(model="llama", grid=(1, 2, 1, 2), amp="bf16"),
    # the checkpoint of cp 2 x dp 2 on cp 4 and on dp 4: the same weights, the same next step
    dict(model="llama", grid=(1, 4, 1, 1), load="cp2dp2", steps=1),
    dict(model="llama", grid=(4, 1, 1, 1), load="cp2dp2", steps=1),
]
TRAIN_8 = [
    dict(model="llama", grid=(1, 4, 1, 2), sp=True),
    dict(model="gpt", grid=(1, 4, 2, 1)),
    dict(model="llama", grid=(2, 4, 1, 1), zero=1, comm="all-gather"),
    dict(model="gpt", grid=(1, 2, 2, 2), sp=True, schedule="zb1"),
    dict(model="llama", grid=(2, 2, 2, 1), schedule="gpipe", recompute="full", comm="all-gather"),
]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    root = tmp_path_factory.mktemp("cp_grids")

    def rooted(run):
        return {k: str(root / v) if k in ("save", "load") else v for k, v in run.items()}

    tables = {2: TRAIN_2, 4: [rooted(r) for r in TRAIN_4], 8: TRAIN_8}
    return {world: (table, run_ranks(world, sweep, table, timeout=600)) for world, table in tables.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def test_every_cp_grid_trains_what_one_process_trains(worlds):
    refs = {(m, clip): reference(m, clip=clip) for m in ("gpt", "llama") for clip in (0.0, 0.05)}
    checked = 0
    for world, (runs, results) in worlds.items():
        for i, run in enumerate(runs):
            if "load" in run:
                continue
            per_rank = [results[r][i] for r in range(world)]
            losses = per_rank[0]["losses"]
            assert all(r["losses"] == losses for r in per_rank), f"{run}: ranks disagree on the loss"
            ref_losses, ref_state = refs[(run["model"], run.get("clip", 0.0))]
            tol = 3e-2 if run.get("amp") else RTOL
            for a, b in zip(losses, ref_losses):
                assert abs(a - b) <= tol * abs(b), f"{run}: loss {a} vs {b}"
            if not run.get("amp"):
                state = {k: torch.from_numpy(v) for r in per_rank for k, v in r["state"].items()}
                assert set(state) == set(ref_state), run
                worst = max((_rel(state[k], ref_state[k]), k) for k in ref_state)
                assert worst[0] <= RTOL, (run, worst)
            checked += 1
    assert checked == len(TRAIN_2) + len(TRAIN_4) + len(TRAIN_8) - 2


def test_the_trace_records_every_hop_of_the_ring(worlds):
    """Interleaved pp 2 x 2 chunks of the 2-block GPT: each pipeline rank holds one block; per micro-batch its ring
    makes cp - 1 K/V hops forward, cp - 1 backward and cp dK/dV hops (the last one home): 4 at cp 2."""
    runs, results = worlds[4]
    i = next(i for i, r in enumerate(runs) if r.get("trace"))
    for rank in range(4):
        spans = results[rank][i]["cp_spans"]
        assert [kind for kind, _ in spans] == ["send_recv"] * (MICRO * 4), (rank, spans)
        assert sorted(hop for _, hop in spans) == sorted([0, 0, 0, 1] * MICRO), (rank, spans)


def test_a_checkpoint_reshards_across_cp_sizes(worlds):
    runs, results = worlds[4]
    saved = next(i for i, r in enumerate(runs) if "save" in r)
    on_cp4, on_dp4 = (i for i, r in enumerate(runs) if "load" in r)
    written = results[0][saved]["state"]
    ref_losses, _ = reference("llama", STEPS + 1)
    for i in (on_cp4, on_dp4):
        loaded = results[0][i]["loaded"]
        assert set(loaded) == set(written)
        assert all((loaded[k] == written[k]).all() for k in written), runs[i]
        assert abs(results[0][i]["losses"][0] - ref_losses[STEPS]) <= RTOL * ref_losses[STEPS], runs[i]
    assert results[0][on_cp4]["losses"] == pytest.approx(results[0][on_dp4]["losses"], rel=RTOL)
