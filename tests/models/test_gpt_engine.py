"""The GPT through the Engine: every grid reproduces a 1-rank engine run and an independent plain-PyTorch loop.

Tiny shapes (vocab 67: padded to 68 at mp=2; hidden 32, 4 heads, 4 blocks, seq 16), fp32, SGD with momentum (an
exact-match test: AdamW's normalisation turns rounding noise into lr-sized steps), 3 steps of 8 sequences in 4
micro-batches per DP rank. Grids are grouped by world size so each run_ranks call reuses its processes.
"""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.data import MarkovChain, TokenDataset, open_dataset
from hybrid_engine.engine.evaluate import evaluate
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models.gpt.model import GPTConfig, gpt_loss
from hybrid_engine.models.gpt.parallelize import build_gpt
from hybrid_engine.models.gpt.workload import gpt_workload

VOCAB, SEQ, BATCH, MICRO, STEPS, LR, MOMENTUM = 67, 16, 8, 4, 3, 0.1, 0.9
RTOL = 1e-5


def config(tied: bool) -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, layers=4, hidden=32, heads=4, seq_len=SEQ, tie_embeddings=tied, seed=3)


def dataset(vocab: int = VOCAB) -> TokenDataset:
    return TokenDataset(MarkovChain(5, vocab=vocab).sample(4096, 7), vocab, SEQ, seed=11)


def train_engine(rank: int, run: dict, steps: int = STEPS, data: TokenDataset | None = None,
                 load: dict | None = None):
    """(engine, groups, losses, grad norms) of one run on this rank, after loading `load` (a merged
    state_for_checkpoint) when given; the caller closes them."""
    data = data or dataset()
    workload = gpt_workload(config(run.get("tied", False)), data, sequence_parallel=run.get("sp", False),
                            recompute=run.get("recompute", "none"), fp32_residual=run.get("fp32_residual", False))
    pp, v = run.get("pp", 1), run.get("v", 1)
    groups = build_groups(ProcessGrid(run.get("dp", 1), pp, run.get("mp", 1)), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                         micro_batches=MICRO, virtual_stages=v, merge_weight_grads=run.get("merge", False),
                         optimizer=run.get("optimizer", optim.SGD(LR, MOMENTUM)), recompute=workload.full_recompute,
                         amp=run.get("amp", "off"), impl=run.get("impl", "half-weights"),
                         clip_grad=run.get("clip", 0.0), zero=run.get("zero", 0),
                         dp_bucket_mb=run.get("bucket_mb", 256.0), **workload.engine_kwargs(pp * v))
    if load is not None:
        engine.load_checkpoint_state(load["weights"], load["optimizer"], load["scaler"])
    per_dp = BATCH // groups.grid.dp_size
    dp = groups.coords.dp
    losses, norms = [], []
    for step in range(run.get("first_step", 0), run.get("first_step", 0) + steps):
        x, y = workload.draw(step, dp * per_dp, (dp + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage)
        result = engine.train_step(x, y)
        losses.append(result.loss)
        norms.append(result.grad_norm)
    return engine, groups, losses, norms


def _close(engine, groups) -> None:
    engine.close()
    groups.destroy()
    dist.barrier()


def train_grids(rank: int, world: int, runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        engine, groups, losses, norms = train_engine(rank, run)
        per_dp, dp = BATCH // groups.grid.dp_size, groups.coords.dp
        x, y = dataset().val_batch(0, BATCH, dp * per_dp, (dp + 1) * per_dp)
        val = evaluate(engine, x if engine.holds_first_stage else None, y if engine.holds_last_stage else None,
                       micro_batches=2)
        state = {k: t.float().numpy() for k, t in engine.full_state_dict().items()}
        programs = [p.describe() for p in engine.stage_programs.values()]
        selective = [m.recompute_attention_core for stage in engine.stages.values() for m in stage
                     if hasattr(m, "recompute_attention_core")]
        _close(engine, groups)
        out.append({"losses": losses, "norms": norms, "state": state, "programs": programs, "val": val,
                    "selective": selective})
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


def dense_val(tied: bool, state: dict[str, torch.Tensor]) -> float:
    """The validation loss of the dense GPT with these weights on validation batch 0."""
    model = build_gpt(config(tied))
    model.load_state_dict(state)
    x, y = dataset().val_batch(0, BATCH)
    with torch.no_grad():
        return gpt_loss(model(x), y).item()


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
    "pp2 zb1 per-micro W": {"pp": 2, "schedule": "zb1"},
    "pp2 gpipe tied": {"pp": 2, "schedule": "gpipe", "tied": True},
    "pp2 interleaved v2 tied": {"pp": 2, "schedule": "interleaved", "v": 2, "tied": True},
    "mp2": {"mp": 2},
    "mp2 sequence parallel tied": {"mp": 2, "sp": True, "tied": True},
    "dp2 tied": {"dp": 2, "tied": True},
    "pp2 full recompute tied": {"pp": 2, "recompute": "full", "tied": True},
    "mp2 sp selective recompute": {"mp": 2, "sp": True, "recompute": "selective"},
    # Clipping at half the norm: the tied weight counts once in the global norm, whatever the grid.
    "pp2 tied clipped": {"pp": 2, "tied": True, "clip": 0.5},
    "mp2 sp tied clipped": {"mp": 2, "sp": True, "tied": True, "clip": 0.5},
    # ZeRO-1 with both tied copies on one stage: each in a bucket of its own, their DP shards added locally.
    "dp2 zero1 tied": {"dp": 2, "zero": 1, "tied": True, "unsharded": "dp2 tied"},
    # ZeRO-3 without a pipeline: buckets gathered and released around their layers, tied copies in their own.
    "dp2 zero3 tied": {"dp": 2, "zero": 3, "tied": True, "bucket_mb": 0.004, "unsharded": "dp2 tied"},
}
# Half weights (fp32 masters, the loss in fp32 from half logits): close to fp32, not equal.
GRIDS_HALF = {
    "pp2 bf16 tied": {"pp": 2, "tied": True, "amp": "bf16"},
    "mp2 sp fp16 tied": {"mp": 2, "sp": True, "tied": True, "amp": "fp16", "schedule": "1f1b"},
    "pp2 bf16 autocast tied": {"pp": 2, "tied": True, "amp": "bf16", "impl": "autocast"},
    # plain SGD with half weights takes the fused SGD + cast update (no momentum: only step 0 compares)
    "pp2 fp16 fused SGD tied": {"pp": 2, "tied": True, "amp": "fp16", "optimizer": optim.SGD(LR)},
    "dp2 zero1 bf16 tied": {"dp": 2, "zero": 1, "tied": True, "amp": "bf16"},
    # --fp32-residual: fp32 activations between the stages, fp32 LayerNorm inputs under sequence parallelism
    "pp2 bf16 fp32 residual tied": {"pp": 2, "tied": True, "amp": "bf16", "fp32_residual": True},
    "mp2 sp fp16 fp32 residual tied": {"mp": 2, "sp": True, "tied": True, "amp": "fp16", "fp32_residual": True},
}
GRIDS_4 = {
    "pp4 1f1b tied": {"pp": 4, "tied": True},
    "mp4 sequence parallel tied": {"mp": 4, "sp": True, "tied": True},
    "pp2 mp2 zb1 merged W sp tied": {"pp": 2, "mp": 2, "schedule": "zb1", "merge": True, "sp": True, "tied": True},
    "dp2 mp2": {"dp": 2, "mp": 2},
    # ZeRO-1 with the tied copies on the first and last stage: the DP reduce-scatter runs inside the backward,
    # then the copies' shards are summed across the pipeline. Small buckets cut the other layers mid-tensor.
    "dp2 pp2 tied": {"dp": 2, "pp": 2, "tied": True},
    "dp2 pp2 zero1 tied": {"dp": 2, "pp": 2, "zero": 1, "tied": True, "bucket_mb": 0.004,
                           "unsharded": "dp2 pp2 tied"},
    # the tied weight counts once in the norm summed over DP shards, and its uncounted copy is still clipped
    "dp2 pp2 zero1 tied clipped": {"dp": 2, "pp": 2, "zero": 1, "tied": True, "clip": 0.5},
    # ZeRO-2 and 3 across the pipeline: the tied copies' gradient shards summed across it
    "dp2 pp2 zero2 tied clipped": {"dp": 2, "pp": 2, "zero": 2, "tied": True, "clip": 0.5},
    "dp2 pp2 zero3 tied": {"dp": 2, "pp": 2, "zero": 3, "tied": True, "bucket_mb": 0.004,
                           "unsharded": "dp2 pp2 tied"},
}
GRIDS_8 = {
    "dp2 pp2 mp2 sequence parallel tied": {"dp": 2, "pp": 2, "mp": 2, "sp": True, "tied": True},
    "dp2 pp2 mp2 interleaved v2": {"dp": 2, "pp": 2, "mp": 2, "schedule": "interleaved", "v": 2},
    "dp2 pp2 mp2 sp zero1 tied": {"dp": 2, "pp": 2, "mp": 2, "sp": True, "zero": 1, "tied": True,
                                  "bucket_mb": 0.004, "unsharded": "dp2 pp2 mp2 sequence parallel tied"},
}
GRIDS_1 = {"1 rank": {}, "1 rank tied": {"tied": True}, "1 rank tied clipped": {"tied": True, "clip": 0.5}}


@pytest.fixture(scope="module")
def references():
    return {tied: reference(tied) for tied in (False, True)}


@pytest.fixture(scope="module")
def one_rank():
    results = run_ranks(1, train_grids, list(GRIDS_1.values()), timeout=120)[0]
    return {(run.get("tied", False), run.get("clip", 0.0)): r for run, r in zip(GRIDS_1.values(), results)}


def test_one_rank_engine_matches_plain_pytorch(one_rank, references):
    for tied in (False, True):
        r = one_rank[(tied, 0.0)]
        assert_matches(r["losses"], merged_state([r]), *references[tied], f"1 rank tied={tied}")
    assert all("autograd" in p for p in one_rank[(False, 0.0)]["programs"])
    for tied in (False, True):  # evaluate(): the forward-only loss equals the dense model's
        val = dense_val(tied, references[tied][1])
        assert abs(one_rank[(tied, 0.0)]["val"] - val) <= RTOL * val
    # The clipped run's norm is the plain-PyTorch norm of the summed tied gradient (one copy): checked against
    # the unclipped run's first step, whose gradients are the same.
    clipped = one_rank[(True, 0.5)]
    assert clipped["norms"][0] > 0.5 and clipped["losses"][0] == one_rank[(True, 0.0)]["losses"][0]
    assert clipped["losses"][1] != one_rank[(True, 0.0)]["losses"][1]


def test_one_rank_grad_norm_counts_the_tied_weight_once(one_rank):
    torch.set_num_threads(1)
    cfg, data = config(True), dataset()
    model = build_gpt(cfg)
    model[-1].lm_head.weight = model[0].word
    x, y = data.batch(0, BATCH)
    for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
        (gpt_loss(model(xm), ym) / MICRO).backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    assert abs(one_rank[(True, 0.5)]["norms"][0] - norm) <= 1e-5 * norm


@pytest.mark.parametrize("world, grids", [(2, GRIDS_2), (4, GRIDS_4), (8, GRIDS_8)],
                         ids=["2 ranks", "4 ranks", "8 ranks"])
def test_every_grid_matches_one_rank_and_plain_pytorch(world, grids, one_rank, references):
    results = run_ranks(world, train_grids, list(grids.values()), timeout=600)
    for i, (name, run) in enumerate(grids.items()):
        per_rank = [r[i] for r in results]
        losses, state = per_rank[0]["losses"], merged_state(per_rank)
        tied, clip = run.get("tied", False), run.get("clip", 0.0)
        assert all(r["losses"] == losses for r in per_rank), f"{name}: ranks disagree on the loss"
        assert all(r["val"] == per_rank[0]["val"] for r in per_rank), f"{name}: ranks disagree on evaluate()"
        base = one_rank[(tied, clip)]
        assert_matches(losses, state, base["losses"], merged_state([base]), f"{name} vs 1 rank")
        assert abs(per_rank[0]["val"] - base["val"]) <= RTOL * base["val"], f"{name}: evaluate()"
        if clip:
            for a, b in zip(per_rank[0]["norms"], base["norms"]):
                assert abs(a - b) <= RTOL * b, f"{name}: grad norm {a} vs {b}"
        else:
            assert_matches(losses, state, *references[tied], f"{name} vs plain PyTorch")
        recompute = run.get("recompute", "none")
        assert all(("recomputed" in p) == (recompute == "full") for r in per_rank for p in r["programs"]), name
        assert all(all(r["selective"]) == (recompute == "selective") for r in per_rank if r["selective"]), name
        if tied:  # the two copies stay equal
            assert torch.equal(state["0.word"], state["5.lm_head.weight"]), name
        if "unsharded" in run:  # ZeRO-1 against the same grid's replicated optimizer
            twin = list(grids).index(run["unsharded"])
            assert_matches(losses, state, results[0][twin]["losses"], merged_state([r[twin] for r in results]),
                           f"{name} vs {run['unsharded']}")


def test_half_weights_train_the_gpt_close_to_fp32(references):
    results = run_ranks(2, train_grids, list(GRIDS_HALF.values()), timeout=300)
    ref_losses = references[True][0]
    for i, name in enumerate(GRIDS_HALF):
        losses, state = results[0][i]["losses"], merged_state([r[i] for r in results])
        assert all(math.isfinite(v) for v in losses), name
        for a, b in zip(losses, ref_losses if "optimizer" not in GRIDS_HALF[name] else ref_losses[:1]):
            assert abs(a - b) <= 3e-2 * b, f"{name}: loss {a} vs fp32 {b}"
        assert losses[-1] < losses[0], name
        assert torch.equal(state["0.word"], state["5.lm_head.weight"]), name  # fp32 masters stay tied


# ------------------------------------------------------------------------------------------------ resharding


def _merged_checkpoint_state(engine) -> dict:
    """Every rank's state_for_checkpoint merged (what checkpoint.save writes and load reads, without files)."""
    state = engine.state_for_checkpoint()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    merged = {"weights": {}, "optimizer": {}, "scaler": state["scaler"]}
    for part in gathered:
        merged["weights"].update(part["weights"])
        merged["optimizer"].update(part["optimizer"])
    return merged


def resume_on_other_grids(rank: int, world: int, hops: list[dict]) -> list[list[float]]:
    """Two steps on each grid of `hops` in turn, each starting from the previous grid's checkpoint state."""
    curve, load = [], None
    for i, run in enumerate(hops):
        engine, groups, losses, _ = train_engine(rank, dict(run, first_step=2 * i), steps=2, load=load)
        load = _merged_checkpoint_state(engine)
        _close(engine, groups)
        curve.append(losses)
    return curve


def test_checkpoint_state_reshards_across_grids_and_continues_the_curve():
    """pp2 -> mp2 with sequence parallel (vocabulary 67 padded to 68: heads and vocabulary rows reshard) -> dp2:
    the momentum buffers and weights travel as full tensors, and the joined curve is the uninterrupted one."""
    hops = [{"pp": 2, "tied": True}, {"mp": 2, "sp": True, "tied": True}, {"dp": 2, "tied": True}]
    curve = run_ranks(2, resume_on_other_grids, hops, timeout=300)[0]
    ref_losses, _ = reference(True, steps=6)
    joined = [v for part in curve for v in part]
    for step, (a, b) in enumerate(zip(joined, ref_losses)):
        assert abs(a - b) <= RTOL * b, f"step {step}: resumed {a} vs uninterrupted {b}"


def test_zero1_tied_checkpoint_state_reshards_to_and_from_the_replicated_optimizer():
    """dp2 pp2 under ZeRO-1 (each tied copy sharded over DP on its own stage) -> pp2 mp2 replicated -> dp2 pp2
    ZeRO-1 with small buckets (other shard boundaries): both copies' momentum buffers travel as full tensors,
    and the joined curve is the uninterrupted one."""
    hops = [{"dp": 2, "pp": 2, "zero": 1, "tied": True}, {"pp": 2, "mp": 2, "sp": True, "tied": True},
            {"dp": 2, "pp": 2, "zero": 1, "tied": True, "bucket_mb": 0.004}]
    curve = run_ranks(4, resume_on_other_grids, hops, timeout=300)[0]
    ref_losses, _ = reference(True, steps=6)
    joined = [v for part in curve for v in part]
    assert len(joined) == 6
    for step, (a, b) in enumerate(zip(joined, ref_losses)):
        assert abs(a - b) <= RTOL * b, f"step {step}: resumed {a} vs uninterrupted {b}"


# ------------------------------------------------------------------------------------------------ learning


def learn_markov(rank: int, world: int) -> tuple[float, float]:
    """300 AdamW steps of 16 x 32 tokens of the built-in corpus on mp2 with sequence parallel; the validation
    loss of the gathered weights, and the source's entropy rate."""
    data = open_dataset(None, 32, seed=0, markov_tokens=1 << 17)
    cfg = GPTConfig(vocab_size=256, layers=1, hidden=32, heads=2, seq_len=32, seed=0)
    workload = gpt_workload(cfg, data, sequence_parallel=True)
    groups = build_groups(ProcessGrid(1, 1, 2), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=2,
                         optimizer=optim.AdamW(lr=2e-2, weight_decay=0.0), **workload.engine_kwargs(1))
    for step in range(300):
        engine.train_step(*workload.draw(step, 0, 16))
    state = engine.full_state_dict()
    _close(engine, groups)
    model = build_gpt(cfg)
    model.load_state_dict(state)
    batches = data.val_batches(64)
    with torch.no_grad():
        val = sum(gpt_loss(model(x), y).item() for x, y in (data.val_batch(i, 64) for i in range(batches)))
    return val / batches, data.source.entropy_rate_nats()


def test_engine_learns_the_markov_corpus_to_near_its_entropy_floor():
    val, floor = run_ranks(2, learn_markov, timeout=300)[0]
    # Stated margin: within 0.25 nats of the floor (ln 256 = 5.55 at the start), as the dense model gets;
    # measured 1.014 against 0.861.
    assert floor < val < floor + 0.25, (val, floor)


# ------------------------------------------------------------------------------------------------ sampling


def save_gpt_checkpoint(rank: int, world: int, root: str) -> dict:
    """Two steps of a byte-level GPT (vocabulary 256) on mp2 with SP, tied; checkpoint.save; the gathered state."""
    from hybrid_engine import checkpoint

    engine, groups, _, _ = train_engine(rank, {"mp": 2, "sp": True, "tied": True}, steps=2, data=dataset(256))
    run_info = {"model": gpt_workload(config(True), dataset(256)).checkpoint_model, "optimizer": "sgd"}
    checkpoint.save(engine, root, 2, run_info)
    state = {k: t.numpy() for k, t in engine.full_state_dict().items()}
    _close(engine, groups)
    return state


def test_sample_loads_a_checkpoint_from_any_grid_and_continues_a_prompt(tmp_path, capsys):
    import subprocess
    import sys

    from hybrid_engine.train import sample

    state = run_ranks(2, save_gpt_checkpoint, str(tmp_path), timeout=300)[0]
    model, cfg = sample.load_gpt(str(tmp_path))
    assert cfg == dataclasses.replace(config(True), vocab_size=256)
    for name, value in model.state_dict().items():
        assert torch.equal(value, torch.from_numpy(state[name])), name
    assert sample.main(["--load", str(tmp_path), "--prompt", "hello", "--tokens", "20", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("hello") and len(out.rstrip("\n")) > len("hello")
    # The command line, as a user runs it; a bad path is one line and exit 2.
    cli = subprocess.run([sys.executable, "-m", "hybrid_engine.sample", "--load", str(tmp_path), "--prompt", "ab",
                          "--tokens", "8"], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert cli.returncode == 0 and cli.stdout.startswith("ab"), cli.stderr
    assert sample.main(["--load", str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    assert capsys.readouterr().err.startswith("error: no checkpoint at")
