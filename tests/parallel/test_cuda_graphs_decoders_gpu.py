"""CUDA-graphed autograd stages on GPUs (skipped without CUDA, or without enough GPUs for a grid): the tiny Llama and
GPT trained with --cuda-graphs on and off, the same steps, on 1, 2 and 4 GPUs (NCCL, one process per GPU under
torchrun, tests/decoder_graph_runs.py): tp2 (with sequence parallelism), pp2 under 1F1B and interleaved, dp2 with
ZeRO-1, pp2 x tp2 under both, fp8 (its Triton casts and cached weight forms inside the graphs) on one GPU and at
pp2, and the zero-bubble schedules (zb1, zbv, dualpipev) at pp2 and zbv at pp4, whose replayed I leaves its
weight-gradient stashes, the I graph's own buffers in its slot's pool, for the eager W. The graphs replay the kernels the eager stages launch, so the losses and weights agree
to fp32 rounding (atomics in the embedding's backward may sum in another order) and to a bf16 / fp16 rounding step
in half precision, where the fp16 loss scale moves through the same values; every step after the first replays
every micro-batch's F and B, in as many slots as the stage has micro-batches in flight; and closing the engine frees
the graphs that captured the MP groups' collectives before those groups are destroyed (NCCL waits for such graphs to
die: a held program once hung the two-GPU job in destroy_process_group).

    python -m pytest -q -p no:cacheprovider -n 0 tests/parallel/test_cuda_graphs_decoders_gpu.py
    python -m pytest -q -p no:cacheprovider -n 0 tests/parallel/test_cuda_graphs_decoders_gpu.py -k 2gpu_tp  # one job"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_jobs import run_graph_job
from launch_utils import free_port

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")

# Each job: (GPUs, its grids), one torchrun job apiece, so a job cut by its limit leaves the others' verdicts (and
# names the grid it stopped in); the two-GPU grids are two jobs, tensor-parallel and the rest.
JOBS = {
    "1gpu": (1, {"llama fp32": {}, "gpt fp32 tied": {"model": "gpt", "tied": True},
                  "llama bf16 AdamW": {"amp": "bf16", "optimizer": "adamw"},
                  "gpt fp16": {"model": "gpt", "amp": "fp16"}, "llama one micro-batch": {"m": 1},
                  "llama bf16 fp8 (Triton casts, weight cache)": {"amp": "bf16", "optimizer": "adamw", "fp8": True}}),
    "2gpu_tp": (2, {"llama tp2": {"mp": 2}, "gpt tp2 sequence parallel": {"model": "gpt", "mp": 2, "sp": True},
                      "llama tp2 sequence parallel bf16": {"mp": 2, "sp": True, "amp": "bf16"}}),
    "2gpu_pp_dp": (2, {"llama pp2 1f1b": {"pp": 2},
                         "gpt pp2 interleaved tied": {"model": "gpt", "pp": 2, "schedule": "interleaved", "v": 2,
                                                      "tied": True},
                         "llama pp2 1f1b bf16 AdamW": {"pp": 2, "amp": "bf16", "optimizer": "adamw"},
                         "llama dp2 ZeRO-1": {"dp": 2, "zero": 1},
                         "llama pp2 1f1b fp8": {"pp": 2, "amp": "bf16", "fp8": True}}),
    "2gpu_zero_bubble": (2, {"llama pp2 zb1": {"pp": 2, "schedule": "zb1"},
                              "gpt pp2 zbv tied": {"model": "gpt", "pp": 2, "schedule": "zbv", "v": 2, "tied": True},
                              "llama pp2 zbv bf16 AdamW": {"pp": 2, "schedule": "zbv", "v": 2, "amp": "bf16",
                                                           "optimizer": "adamw"},
                              "llama pp2 dualpipev": {"pp": 2, "schedule": "dualpipev", "v": 2},
                              "llama dp2 ZeRO-1 zb1": {"dp": 2, "zero": 1, "schedule": "zb1"}}),
    "4gpu": (4, {"llama pp2 x tp2 1f1b": {"pp": 2, "mp": 2},
                   "llama pp2 x tp2 interleaved bf16": {"pp": 2, "mp": 2, "schedule": "interleaved", "v": 2,
                                                        "amp": "bf16"},
                   "gpt pp2 x tp2 interleaved sequence parallel": {"model": "gpt", "pp": 2, "mp": 2,
                                                                   "schedule": "interleaved", "v": 2, "sp": True},
                   "llama pp4 1f1b": {"pp": 4, "m": 8},
                   "gpt pp4 zbv bf16": {"model": "gpt", "pp": 4, "schedule": "zbv", "v": 2, "m": 8, "amp": "bf16"}}),
}


def run_job(job: str, tmp_path) -> dict[str, list[tuple[dict, dict]]]:
    """{grid: [(graphed, eager) per rank]} of a job's grids, every run of them in one torchrun job."""
    gpus, grids = JOBS[job]
    return run_graph_job("decoder_graph_runs.py", grids, gpus, tmp_path / job, free_port(),
                         timeout=500)


@pytest.mark.parametrize("job", list(JOBS))
def test_graphed_decoder_stages_train_like_eager_ones(job, tmp_path):
    from decoder_graph_runs import compute_actions
    from hybrid_engine.parallel.pipeline.graphs import slots

    gpus, grids = JOBS[job]
    if GPUS < gpus:
        pytest.skip(f"needs {gpus} GPUs, {GPUS} visible")
    for name, per_rank in run_job(job, tmp_path).items():
        grid = grids[name]
        half = grid.get("amp", "off") != "off"
        for graphed, eager in per_rank:
            assert graphed["graphs"] and not eager["graphs"], name
            assert graphed["kinds"] == ["GraphedAutogradStage"], name
            m, steps = grid.get("m", 4), len(eager["losses"])
            compute = compute_actions(graphed)
            for (captures, replays, kept), stage in zip(graphed["counts"], graphed["slot_of_micro"]):
                assert kept == slots(compute, stage) and captures == 2 * kept, (name, stage)
                assert replays == 2 * m * (steps - 1), (name, stage)  # the first step is the warm-up
            split = grid.get("schedule") in ("zb1", "zbv", "dualpipev")
            assert all((n > 0) == split for n in graphed["stashed"]), (name, graphed["stashed"])
            assert graphed["slots_after_close"] == [0] * len(graphed["counts"]), name
            assert graphed["scales"] == eager["scales"], name
            tolerance = dict(rtol=2e-2, atol=2e-3) if half else dict(rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(graphed["losses"], eager["losses"], **tolerance, err_msg=name)
            for key, value in eager["state"].items():
                np.testing.assert_allclose(graphed["state"][key], value, **tolerance, err_msg=f"{name}: {key}")
