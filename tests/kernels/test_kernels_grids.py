"""The kernels pass on the engine's grids (2 gloo ranks, one launch): with fused kernels every grid -- mp 2 with
and without sequence parallelism, pp 2 under 1f1b and zb1 with selective recompute, dp 2 under ZeRO-1, 2 and 3 -- trains
what the unfused model trains on one process (fp32: relative 1e-5), evaluates to the same validation loss and
gives the same logits; with fp8 the mp 2 and pp 2 (zb1) grids train what one process trains in fp8 (the same
quantization: the scales are the full tensors', so only the products' rounding differs), and so does dp 2 under
ZeRO-1 with full recompute. The GPT's fused loss on mp 2 with SP trains what its unfused mp 2
run trains, and its fp8 runs on mp 2 and pp 2 train alike."""
from __future__ import annotations

import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.engine.evaluate import evaluate, logits
from hybrid_engine.kernels.options import KernelOptions
from hybrid_engine.models.gpt.model import GPTConfig
from hybrid_engine.models.gpt.workload import gpt_workload
from hybrid_engine.models.llama.workload import llama_workload
from hybrid_engine.optim import optimizers as optim
from hybrid_engine.parallel.grid import build_groups

from kernel_models import BATCH, LR, MICRO, MOMENTUM, VOCAB, config, dataset, train_one_process

STEPS = 3
FUSED = KernelOptions(fused=True)
RUNS = [
    dict(grid=(1, 1, 2), kernels=KernelOptions()),  # the unfused baseline of evaluate and logits
    dict(grid=(1, 1, 2), kernels=FUSED),
    dict(grid=(1, 1, 2), kernels=FUSED, sp=True, tied=True),
    dict(grid=(1, 2, 1), kernels=FUSED, tied=True),
    dict(grid=(1, 2, 1), kernels=FUSED, schedule="zb1", recompute="selective"),
    dict(grid=(2, 1, 1), kernels=FUSED, zero=1),
    # ZeRO-3 releases a layer's parameters after its forward: the fused loss reads the head's after the head's
    dict(grid=(2, 1, 1), kernels=FUSED, zero=3),
    dict(grid=(2, 1, 1), kernels=FUSED, zero=2),
    dict(grid=(1, 1, 2), kernels=KernelOptions(fp8="tensorwise")),
    dict(grid=(1, 1, 2), kernels=KernelOptions(fp8="rowwise"), sp=True),
    dict(grid=(1, 2, 1), kernels=KernelOptions(fused=True, fp8="rowwise"), schedule="zb1"),
    # dp 2: each rank's micro-batches are one row, as one process's at 8 micro-batches (the scales are a micro-batch's)
    dict(grid=(2, 1, 1), kernels=KernelOptions(fused=True, fp8="tensorwise"), zero=1, recompute="full"),
]
# The GPT (the fused loss; its LayerNorm and GELU are one kernel each already), held against its own runs
GPT_RUNS = [
    dict(grid=(1, 1, 2), kernels=KernelOptions()),
    dict(grid=(1, 1, 2), kernels=FUSED, sp=True),
    dict(grid=(1, 1, 2), kernels=KernelOptions(fused=True, fp8="tensorwise")),
    dict(grid=(1, 2, 1), kernels=KernelOptions(fused=True, fp8="tensorwise")),
]
PROBE = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(9))


def sweep(rank: int, world: int, runs: list[dict]) -> list[dict]:
    torch.set_num_threads(1)
    results = []
    for run in runs:
        dp, pp, mp = run["grid"]
        if run.get("gpt"):
            workload = gpt_workload(GPTConfig(VOCAB, 4, 32, 4, 16, run.get("tied", False), seed=3), dataset(),
                                    sequence_parallel=run.get("sp", False), kernels=run["kernels"])
        else:
            workload = llama_workload(config(run.get("tied", False)), dataset(), sequence_parallel=run.get("sp", False),
                                      recompute=run.get("recompute", "none"), vocab_from_data=False,
                                      kernels=run["kernels"])
        groups = build_groups(ProcessGrid(dp, pp, mp), rank)
        engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                             micro_batches=MICRO, optimizer=optim.SGD(LR, MOMENTUM), zero=run.get("zero", 0),
                             recompute=workload.full_recompute, **workload.engine_kwargs(pp))
        per_dp, at = BATCH // dp, groups.coords.dp
        losses = []
        for step in range(STEPS):
            x, y = workload.draw(step, at * per_dp, (at + 1) * per_dp, inputs=engine.holds_first_stage,
                                 targets=engine.holds_last_stage)
            losses.append(engine.train_step(x, y).loss)
        x, y = workload.draw(99, at * per_dp, (at + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage)
        validation = evaluate(engine, x, y, MICRO)
        rows = PROBE.shape[0] // dp
        out = logits(engine, PROBE[at * rows:(at + 1) * rows] if engine.holds_first_stage else None)
        keep = out is not None and groups.coords.mp == 0 and at == 0
        results.append({"losses": losses, "validation": validation, "logits": out.numpy() if keep else None})
        engine.close()
        groups.destroy()
        dist.barrier()
    return results


def test_fused_kernels_and_fp8_on_every_grid_train_what_one_process_trains():
    gpt_runs = [dict(run, gpt=True) for run in GPT_RUNS]
    per_rank = run_ranks(2, sweep, RUNS + gpt_runs, timeout=600)
    plain = train_one_process(KernelOptions(), STEPS, tied=False)
    plain_tied = train_one_process(KernelOptions(), STEPS, tied=True)
    base = per_rank[0][0]
    base_logits = next(r[0]["logits"] for r in per_rank if r[0]["logits"] is not None)
    for i, run in enumerate(RUNS):
        got = [per_rank[rank][i] for rank in range(2)]
        losses = got[0]["losses"]
        assert got[1]["losses"] == losses, f"{run}: ranks disagree"
        kernels = run["kernels"]
        if kernels.fp8 is None:
            ref, tol = (plain_tied if run.get("tied") else plain), 1e-5
        else:  # one process in fp8, the same quantization
            ref, tol = train_one_process(kernels, STEPS, micro=MICRO * run["grid"][0]), 2e-4
        for a, b in zip(losses, ref):
            assert abs(a - b) <= tol * abs(b), f"{run}: losses {losses} vs one process {ref}"
        if kernels.fp8 is None and not run.get("tied"):  # the same weights: the same validation loss and logits
            assert abs(got[0]["validation"] - base["validation"]) <= 1e-5 * base["validation"], run
            probe = next(torch.from_numpy(r["logits"]) for r in got if r["logits"] is not None)
            expected = torch.from_numpy(base_logits)[:probe.shape[0]]  # dp 2: DP rank 0's rows
            assert probe.shape[-1] == VOCAB and torch.allclose(probe, expected, rtol=1e-4, atol=1e-5), run
    gpt = [per_rank[0][len(RUNS) + i]["losses"] for i in range(len(GPT_RUNS))]
    assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(gpt[1], gpt[0])), (gpt[1], gpt[0])  # fused = unfused
    assert all(abs(a - b) <= 2e-4 * abs(b) for a, b in zip(gpt[3], gpt[2])), (gpt[3], gpt[2])  # fp8: mp 2 = pp 2
    assert gpt[2] != gpt[0] and abs(gpt[2][-1] - gpt[0][-1]) <= 0.02 * gpt[0][-1]  # quantized, and close
