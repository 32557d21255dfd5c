"""The planner against the Llama-1B shape's long-sequence runs (one GPU at 8k tokens, context parallelism to 128k,
cp 2 x tp 2 with sequence parallelism), each run's plan and flags taken from its command in the results files:
the step time within 15% and the peak within 10% over and 3% under. The runs of 2026-11-27 computed the blocks with
aten's flash kernel (their tree had no other), those of 2026-11-28 with cuDNN's (--cp-kernel auto on an H200) and,
one of them, with flash again (--cp-kernel flash)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hybrid_engine.planner import CARDS
from hybrid_engine.planner.card import GIB
from hybrid_engine.planner.choose import predict
from hybrid_engine.planner.model_shape import shape_of
from hybrid_engine.planner.setting import Setting
from hybrid_engine.train.cli import parse_config
from measured_steps import engine_flags
from plan_flags import plan_of

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
FOUR, TWO = "2026-11-27-4xH200-long-seq.json", "2026-11-27-2xH200-long-seq.json"
ALL = "2026-11-27-4xH200-long-seq-cp4-all.json"  # a later job: cp4 at 16k, 32k, 64k and the all-gather variant
CUDNN = "2026-11-28-4xH200-long-seq.json"  # every run again, the blocks by cuDNN's kernel, beside flash's at 32k
LATER = "2026-11-28-4xH200-long-seq-one-gpu-128k.json"  # one GPU at 32k (and 64k: out of memory), cp2 x tp2 at 128k
SHORT_SHARE = ("at 4k tokens a rank the blocks' kernels do not set the pace: each rank's compute kernels take 105-109 "
               "ms a step (profiled, results/2026-11-28-4xH200-cp4-16k-ring-gather.json), near the predicted step, "
               "and its NCCL kernels 109-169 ms more, mostly waiting for peers that reach each hop at other moments: "
               "a wait the model does not price")
# Steps the model does not reach, each still a miss (so the list is kept honest when the model improves).
STEP_MISSES = {"all-cp4_16k": SHORT_SHARE, "cudnn-cp4_16k": SHORT_SHARE, "cudnn-cp4_16k_gather": SHORT_SHARE}
# Peaks the model does not reach, each still a miss: none. One GPU at 32k ran its stage CUDA-graphed and allocated
# 45.6 GiB at most, within the graphed prediction; the 73.5 GiB its allocator reserved held the eager warm-up's
# cache beside the graphs' pools, which a graphed stage returns before capturing (StageGraphs::release_cached_memory).
PEAK_MISSES: dict[str, str] = {}
# What the runs' flags leave to their data and their tree: the data's vocabulary (their model line: "vocab
# 32000"); on the trees of 2026-11-27 the kernels --fused-kernels auto gave ("fused kernels on (torch.compile'd
# Triton regions): RMSNorm, RoPE, SwiGLU, chunked linear + cross-entropy", tensor parallelism or not) and the
# blocks' only kernel, aten's flash; on the tree of 2026-11-28 what auto gives on the H200 (--plan-card: the fused
# loss, and the fused elementwise modules without tensor parallelism).
RUN_SETTINGS = ["--vocab-size", "32000"]
FLASH_TREE = ["--fused-kernels", "on", "--cp-kernel", "flash"]
CUDNN_TREE = ["--plan-card", "h200"]
MODEL_PARAMS = 852_557_824  # the runs' "853M parameters"


def flags_of(command: str, tree: list[str] = FLASH_TREE) -> list[str]:
    """The engine's flags of a run's command line (less its output, data and timing), with what its tree chose
    (tree: the flags that stand for it; a flag the command gives wins)."""
    flags = engine_flags(command)
    chosen = [word for i in range(0, len(tree), 2) if tree[i] not in flags for word in tree[i:i + 2]]
    return flags + RUN_SETTINGS + chosen


def measured(run: dict) -> tuple[float, float]:
    """(step ms, peak GiB of the first rank): the results' numbers, or the summary line a run printed before its
    time ran out (kept in its `error`)."""
    if "step_ms" in run:
        return run["step_ms"], run["peak_gib_per_gpu"][0]
    summary = run["error"]
    return (float(re.search(r"median step ([\d.]+) ms", summary).group(1)),
            float(re.search(r"peak memory per rank \(GiB\) \[([\d.]+)", summary).group(1)))


def runs():
    """Every engine run of both files. The 2 x H200 runs' tree built each stage in float32 and kept that copy: their
    peaks less it, 4 bytes a parameter (the one-GPU 8k peak less it is the 4 x H200 run's within 0.1 GiB)."""
    for name, copy_bytes, tag, tree in ((FOUR, 0.0, "4x", FLASH_TREE), (TWO, 4.0 * MODEL_PARAMS, "2x", FLASH_TREE),
                                        (ALL, 0.0, "all", FLASH_TREE), (CUDNN, 0.0, "cudnn", CUDNN_TREE),
                                        (LATER, 0.0, "later", CUDNN_TREE)):
        for run in json.loads((RESULTS / name).read_text())["runs"]:
            if run["system"] == "engine" and "out of memory" not in run.get("error", ""):
                step_ms, peak = measured(run)
                yield pytest.param(flags_of(run["command"], tree), step_ms, peak - copy_bytes / GIB,
                                   id=f"{tag}-{run['name']}")


def prediction(flags: list[str]):
    cfg = parse_config(flags)
    return predict(shape_of(cfg), CARDS["h200"], Setting.of(cfg, 1, 1, cfg.parallel.mp or 1), plan_of(flags))


def test_every_run_is_pinned():
    ids = [p.id for p in runs()]
    assert {"4x-gpu1_8k", "4x-cp4_32k", "4x-cp4_128k", "4x-cp2tp2_32k", "2x-cp2_32k", "2x-cp2_64k",
            "2x-cp2_128k", "all-cp4_16k", "all-cp4_64k", "all-cp4_32k_gather", "cudnn-gpu1_8k", "cudnn-cp4_32k",
            "cudnn-cp4_32k_flash", "cudnn-cp4_128k", "cudnn-cp2tp2_32k", "cudnn-cp4_64k", "cudnn-cp4_32k_gather",
            "later-gpu1_32k", "later-cp2tp2_128k"} <= set(ids)
    flash_ab = next(p for p in runs() if p.id == "cudnn-cp4_32k_flash").values[0]
    assert flash_ab[flash_ab.index("--cp-kernel") + 1] == "flash" and flash_ab.count("--cp-kernel") == 1
    assert set(STEP_MISSES) <= set(ids) and set(PEAK_MISSES) <= set(ids)
    cp2tp2 = next(p for p in runs() if p.id == "4x-cp2tp2_32k")
    assert cp2tp2.values[1:] == (362.50, 17.024)  # from its summary line


@pytest.mark.parametrize("flags, step_ms, peak", [p for p in runs() if p.id not in STEP_MISSES])
def test_the_step_is_within_15_percent(flags, step_ms, peak):
    predicted_ms = prediction(flags).step_s * 1e3
    assert abs(predicted_ms / step_ms - 1) <= 0.15, (predicted_ms, step_ms)


@pytest.mark.parametrize("flags, step_ms, peak", [p for p in runs() if p.id in STEP_MISSES])
def test_the_known_misses_still_miss(flags, step_ms, peak):
    predicted_ms = prediction(flags).step_s * 1e3
    assert abs(predicted_ms / step_ms - 1) > 0.15, (predicted_ms, step_ms)


@pytest.mark.parametrize("flags, step_ms, peak", [p for p in runs() if p.id not in PEAK_MISSES])
def test_the_peak_is_within_10_percent_over_and_3_under(flags, step_ms, peak):
    predicted_gib = prediction(flags).peak / GIB
    assert -0.03 <= predicted_gib / peak - 1 <= 0.10, (predicted_gib, peak)


@pytest.mark.parametrize("flags, step_ms, peak", [p for p in runs() if p.id in PEAK_MISSES])
def test_the_known_peak_misses_still_miss(flags, step_ms, peak):
    predicted_gib = prediction(flags).peak / GIB
    assert not -0.03 <= predicted_gib / peak - 1 <= 0.10, (predicted_gib, peak)


def test_the_float32_copy_is_of_the_shapes_own_parameters():
    run = json.loads((RESULTS / TWO).read_text())["runs"][0]
    shape = shape_of(parse_config(flags_of(run["command"])))
    assert sum(layer.params for layer in shape.layers) == MODEL_PARAMS

