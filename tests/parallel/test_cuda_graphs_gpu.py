"""CUDA-graphed native stages on GPUs (skipped without CUDA, or without enough GPUs for a grid): the course MLP
trained with --cuda-graphs on and off, the same steps, on 1, 2 and 4 GPUs (NCCL, one process per GPU under
torchrun, tests/graph_runs.py). Graphs replay the kernels the eager chain launches, so the losses and weights
agree to fp32 rounding, and in fp16 the loss scale moves through the same values (grown every clean step,
halved on overflows) with the same steps skipped."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_jobs import run_graph_job
from launch_utils import free_port

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")

GRIDS = {
    1: {"one GPU fp32": {}, "one GPU fp16": {"amp": "fp16"}, "one GPU one micro-batch": {"m": 1}},
    2: {"pp2 1f1b": {"pp": 2}, "pp2 gpipe": {"pp": 2, "schedule": "gpipe"},
        "pp2 interleaved": {"pp": 2, "schedule": "interleaved", "v": 2}, "mp2": {"mp": 2}, "dp2": {"dp": 2},
        "dp2 ZeRO-1": {"dp": 2, "zero": 1}, "pp2 fp16": {"pp": 2, "amp": "fp16"},
        "mp2 fp16": {"mp": 2, "amp": "fp16"}, "dp2 fp16": {"dp": 2, "amp": "fp16"}},
    4: {"pp4 1f1b fp16": {"pp": 4, "amp": "fp16", "m": 8}, "pp2 x mp2": {"pp": 2, "mp": 2},
        "dp2 x pp2 interleaved": {"dp": 2, "pp": 2, "schedule": "interleaved", "v": 2},
        "dp2 x mp2 fp16": {"dp": 2, "mp": 2, "amp": "fp16"}, "mp4": {"mp": 4}},
}


def run_on_gpus(gpus: int, tmp_path) -> dict[str, list[tuple[dict, dict]]]:
    """{grid: [(graphed, eager) per rank]} of GRIDS[gpus], every run of them in one torchrun job."""
    return run_graph_job("graph_runs.py", GRIDS[gpus], gpus, tmp_path / f"gpus{gpus}", free_port(), timeout=400)


@pytest.mark.parametrize("gpus", sorted(GRIDS))
def test_graphed_stages_train_like_eager_ones(gpus, tmp_path):
    if GPUS < gpus:
        pytest.skip(f"needs {gpus} GPUs, {GPUS} visible")
    for name, per_rank in run_on_gpus(gpus, tmp_path).items():
        half = GRIDS[gpus][name].get("amp", "off") != "off"
        for graphed, eager in per_rank:
            assert graphed["graphs"] and not eager["graphs"], name
            m = GRIDS[gpus][name].get("m", 4)
            for captures, replays in graphed["counts"]:  # every later step replays; the first is the warm-up
                assert captures == 2 * m and replays == 2 * m * (len(eager["losses"]) - 1), name
            assert graphed["slots_after_close"] == [0] * len(graphed["counts"]), name  # freed before the groups
            assert graphed["scales"] == eager["scales"] and graphed["skipped"] == eager["skipped"], name
            tolerance = dict(rtol=1e-3, atol=1e-4) if half else dict(rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(graphed["losses"], eager["losses"], **tolerance, err_msg=name)
            for key, value in eager["state"].items():
                np.testing.assert_allclose(graphed["state"][key], value, **tolerance, err_msg=f"{name}: {key}")
