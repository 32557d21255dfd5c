"""The Llama on every axis, against a one-process run: every grid and schedule trains what plain PyTorch trains on
one process (fp32, CPU: relative 1e-5), half weights close to it; an imported Hugging Face model gives
transformers' logits on dp x pp x mp grids of 4 and 8 ranks (mp 1, 2, 4; kv heads split, and replicated where
there are fewer than mp); an import fine-tuned 3 steps on a grid and exported loads in transformers with the
engine's logits.

Tiny shapes (vocab 67: padded to 68 at mp 4; hidden 32, 4 heads, 2 kv heads, ffn 48, 4 blocks, seq 16), SGD with
momentum (exact-match), 3 steps of 8 sequences in 4 micro-batches per DP rank; AdamW with weight decay on the
matrices only (ZeRO-1 cuts its shards where decayed and undecayed parameters meet) against torch's AdamW with the
same two param groups. One run_ranks call per world size sweeps all of its runs in the same processes."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import hf_models
from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid, checkpoint
from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.engine.evaluate import logits
from hybrid_engine.hf.convert import export_model, import_model
from hybrid_engine.models.decoder import next_token_loss
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.parallelize import build_llama
from hybrid_engine.models.llama.workload import llama_config_of, llama_workload
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.grid import build_groups

VOCAB, SEQ, BATCH, MICRO, STEPS, LR, MOMENTUM = 67, 16, 8, 4, 3, 0.1, 0.9
ADAMW = dict(lr=1e-2, weight_decay=0.1)
RTOL = 1e-5
PROBE = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(9))  # the logits' input


def config(tied: bool) -> LlamaConfig:
    return LlamaConfig(VOCAB, 4, 32, 4, 2, 48, SEQ, tie_embeddings=tied, rope_theta=500.0, seed=3)


def dataset() -> TokenDataset:
    return TokenDataset(MarkovChain(5, vocab=VOCAB).sample(4096, 7), VOCAB, SEQ, seed=11)


def _engine(rank: int, run: dict, cfg: LlamaConfig):
    workload = llama_workload(cfg, dataset(), sequence_parallel=run.get("sp", False),
                              recompute=run.get("recompute", "none"), vocab_from_data=False)
    dp, pp, mp = run["grid"]
    v = run.get("v", 1)
    groups = build_groups(ProcessGrid(dp, pp, mp), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                         micro_batches=MICRO, virtual_stages=v, merge_weight_grads=run.get("merge", False),
                         optimizer=optim.AdamW(**ADAMW) if run.get("optimizer") == "adamw" else optim.SGD(LR, MOMENTUM),
                         recompute=workload.full_recompute,
                         amp=run.get("amp", "off"), zero=run.get("zero", 0), dp_bucket_mb=run.get("bucket_mb", 256.0),
                         **workload.engine_kwargs(pp * v))
    return engine, groups, workload


def _train(engine, groups, workload, first: int = 0) -> list[float]:
    per_dp, dp = BATCH // groups.grid.dp_size, groups.coords.dp
    out = []
    for step in range(first, first + STEPS):
        x, y = workload.draw(step, dp * per_dp, (dp + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage)
        out.append(engine.train_step(x, y).loss)
    return out


def _logits(engine, groups) -> torch.Tensor | None:
    """The full logits of PROBE, from the rank of each DP replica's last stage with mp 0 (None elsewhere)."""
    rows = PROBE.shape[0] // groups.grid.dp_size
    dp = groups.coords.dp
    out = logits(engine, PROBE[dp * rows : (dp + 1) * rows] if engine.holds_first_stage else None)
    return out if out is not None and groups.coords.mp == 0 else None


def sweep(rank: int, world: int, runs: list[dict]) -> list[dict]:
    """Each run: "train" (seeded weights, 3 steps: losses and full state), "logits" (load an imported checkpoint,
    the logits of PROBE) or "finetune" (load an import, 3 steps, save to run["save"], the logits of PROBE)."""
    results = []
    for run in runs:
        if run["kind"] == "train":
            cfg = config(run.get("tied", False))
        else:
            cfg = llama_config_of(checkpoint.open_checkpoint(run["ckpt"]).manifest["model"], seq_len=SEQ)
        engine, groups, workload = _engine(rank, run, cfg)
        out = {}
        if run["kind"] != "train":
            assert checkpoint.load(engine, checkpoint.open_checkpoint(run["ckpt"])) == 0
        if run["kind"] != "logits":
            out["losses"] = _train(engine, groups, workload)
            state = engine.full_state_dict()
            out["state"] = {k: v.float().numpy() for k, v in state.items()} if groups.coords.dp == 0 else {}
        if run["kind"] == "finetune":
            checkpoint.save(engine, run["save"], STEPS, {"model": workload.checkpoint_model, "optimizer": "sgd"})
        if run["kind"] != "train":
            probe = _logits(engine, groups)
            out["logits"] = None if probe is None else probe.numpy()  # tensors would travel as fds
            out["dp"] = groups.coords.dp
        engine.close()
        groups.destroy()
        dist.barrier()
        results.append(out)
    return results


def reference(tied: bool, optimizer: str = "sgd") -> tuple[list[float], dict[str, torch.Tensor]]:
    """Plain PyTorch on one process: the dense Llama (tied: one Parameter for the embedding and the head), SGD
    with momentum or AdamW decaying the matrices only, the batch in 2-row micro-batches whose losses are divided by
    their count."""
    torch.set_num_threads(1)
    model, data = build_llama(config(tied)), dataset()
    if tied:
        model[-1].lm_head.weight = model[0].word
    if optimizer == "adamw":
        params = list(model.parameters())
        groups = [{"params": [p for p in params if optim.decays(p)]},
                  {"params": [p for p in params if not optim.decays(p)], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, **ADAMW)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS):
        x, y = data.batch(step, BATCH)
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(BATCH // 2), y.chunk(BATCH // 2)):
            loss = next_token_loss(model(xm), ym) / (BATCH // 2)
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if tied:
        state["5.lm_head.weight"] = state["0.word"]
    return losses, state


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


TRAIN_4 = [
    dict(grid=(1, 4, 1)),
    dict(grid=(1, 2, 2), schedule="zb1", merge=True, sp=True, tied=True),
    dict(grid=(1, 1, 4), sp=True, tied=True),  # 2 kv heads over mp 4: replicated, their gradients summed over MP
    dict(grid=(2, 1, 2), zero=1, bucket_mb=0.004),
    dict(grid=(2, 2, 1), schedule="interleaved", v=2, tied=True),
    dict(grid=(1, 2, 2), schedule="gpipe", recompute="selective"),
    dict(grid=(2, 2, 1), recompute="full", zero=1, tied=True),
    dict(grid=(1, 2, 2), schedule="zb1", sp=True, recompute="selective", tied=True),
    # AdamW turns rounding noise into lr-sized steps (the grids differ from one process by ~1e-4), so its runs are
    # held against the same grid's replicated optimizer exactly and against one process loosely
    dict(grid=(2, 1, 2), tied=True, optimizer="adamw"),
    dict(grid=(2, 1, 2), zero=1, bucket_mb=0.004, tied=True, optimizer="adamw", twin=8),
]
HALF_4 = [dict(grid=(1, 2, 2), amp="bf16", tied=True), dict(grid=(2, 1, 2), amp="fp16", sp=True, zero=1)]
TRAIN_8 = [dict(grid=(2, 2, 2), sp=True, zero=1, tied=True, bucket_mb=0.004),
           dict(grid=(1, 2, 4), schedule="zb1", merge=True, sp=True)]
LOGITS_4 = [("gqa", (1, 1, 4), False), ("gqa", (2, 2, 1), False), ("tied", (1, 2, 2), True),
            ("qwen2", (2, 1, 2), False), ("qwen2", (1, 1, 4), True)]
LOGITS_8 = [("gqa", (2, 2, 2), True), ("tied", (1, 2, 4), False), ("qwen2", (2, 1, 4), True)]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """{kind: (transformers model, its directory, its imported checkpoint)}."""
    root = tmp_path_factory.mktemp("llama_grids")
    out = {}
    for kind in ("gqa", "tied", "qwen2"):
        model = hf_models.make(kind, str(root / kind))
        import_model(str(root / kind), str(root / f"{kind}_ckpt"))
        out[kind] = (model, str(root / kind), str(root / f"{kind}_ckpt"))
    out["root"] = root
    return out


@pytest.fixture(scope="module")
def worlds(imported):
    """Every run of each world size, in one run_ranks call per size."""
    def logit_runs(table):
        return [dict(kind="logits", model=k, grid=g, sp=sp, ckpt=imported[k][2]) for k, g, sp in table]

    finetune = dict(kind="finetune", model="gqa", grid=(1, 2, 2), sp=True, ckpt=imported["gqa"][2],
                    save=str(imported["root"] / "finetuned"))
    runs = {4: [dict(r, kind="train") for r in TRAIN_4 + HALF_4] + logit_runs(LOGITS_4) + [finetune],
            8: [dict(r, kind="train") for r in TRAIN_8] + logit_runs(LOGITS_8)}
    return {world: (table, run_ranks(world, sweep, table, timeout=600)) for world, table in runs.items()}


def _per_run(worlds):
    for world, (runs, results) in worlds.items():
        for i, run in enumerate(runs):
            yield run, [results[rank][i] for rank in range(world)]


def test_every_grid_and_schedule_trains_what_one_process_trains(worlds):
    refs = {(tied, opt): reference(tied, opt) for tied in (False, True) for opt in ("sgd", "adamw")}
    checked = 0
    states = {}
    for run, per_rank in _per_run(worlds):
        if run["kind"] != "train":
            continue
        ref_losses, ref_state = refs[(run.get("tied", False), run.get("optimizer", "sgd"))]
        losses = per_rank[0]["losses"]
        assert all(r["losses"] == losses for r in per_rank), f"{run}: ranks disagree on the loss"
        state = {k: torch.from_numpy(v) for r in per_rank for k, v in r["state"].items()}
        assert set(state) == set(ref_state), run
        tol = 3e-2 if run.get("amp") else RTOL  # half weights: fp32 masters, half GEMMs
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= tol * abs(b), f"{run}: loss {a} vs {b}"
        if not run.get("amp"):
            worst = max((_rel(state[k], ref_state[k]), k) for k in ref_state)
            assert worst[0] <= (1e-3 if run.get("optimizer") == "adamw" else RTOL), (run, worst)
        states[len(states)] = state
        if "twin" in run:  # ZeRO-1's shards cut at the decay boundary: the replicated optimizer's very update
            twin = states[run["twin"]]
            assert all(_rel(state[k], twin[k]) <= 1e-6 for k in twin), run
        if run.get("tied"):
            assert torch.equal(state["0.word"], state["5.lm_head.weight"]), run
        checked += 1
    assert checked == len(TRAIN_4 + HALF_4 + TRAIN_8)


def test_an_import_gives_the_logits_of_transformers_on_every_grid(worlds, imported):
    checked = 0
    for run, per_rank in _per_run(worlds):
        if run["kind"] != "logits":
            continue
        rows = PROBE.shape[0] // run["grid"][0]
        theirs = hf_models.hf_logits(imported[run["model"]][0], PROBE)
        got = [r for r in per_rank if r["logits"] is not None]
        assert sorted(r["dp"] for r in got) == list(range(run["grid"][0])), run
        for r in got:
            part, ours = theirs[r["dp"] * rows : (r["dp"] + 1) * rows], torch.from_numpy(r["logits"])
            assert ours.shape == part.shape and _rel(ours, part) < RTOL, (run, _rel(ours, part))
        checked += 1
    assert checked == len(LOGITS_4 + LOGITS_8)


def test_an_import_fine_tuned_on_a_grid_exports_to_transformers_with_the_engines_logits(worlds, imported):
    from transformers import AutoModelForCausalLM

    (run, per_rank), = [(r, p) for r, p in _per_run(worlds) if r["kind"] == "finetune"]
    assert per_rank[0]["losses"][-1] < per_rank[0]["losses"][0]
    out = str(imported["root"] / "finetuned_hf")
    export_model(run["save"], out)
    tuned = AutoModelForCausalLM.from_pretrained(out).eval()
    engine_logits = torch.from_numpy(next(r["logits"] for r in per_rank if r["logits"] is not None))
    assert _rel(engine_logits, hf_models.hf_logits(tuned, PROBE)) < RTOL
    before = hf_models.hf_logits(imported["gqa"][0], PROBE)
    assert _rel(engine_logits, before) > 1e-3  # the three steps did change the model
    assert os.path.isfile(os.path.join(out, "model.safetensors"))
