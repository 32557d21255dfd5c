"""The planner against the Llama-1B shape's long-sequence runs (one GPU at 8k tokens, context parallelism to 128k,
cp 2 x tp 2 with sequence parallelism), each run's plan and flags taken from its command in the results files:
the step time within 15% and the peak within 10% over and 3% under."""
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
# Steps the model does not reach, each still a miss (so the list is kept honest when the model improves).
STEP_MISSES = {"all-cp4_16k": ("4k tokens a rank: measured 185 ms against 117 predicted, slower a token than at 32k "
                               "(347 ms for twice the tokens and four times the attention); not yet traced")}
# What the runs' flags leave to their data and their tree: the data's vocabulary (their model line: "vocab
# 32000"), and the kernels --fused-kernels auto gave on that tree ("fused kernels on (torch.compile'd Triton
# regions): RMSNorm, RoPE, SwiGLU, chunked linear + cross-entropy").
RUN_SETTINGS = ["--vocab-size", "32000", "--fused-kernels", "on"]
MODEL_PARAMS = 852_557_824  # the runs' "853M parameters"


def flags_of(command: str) -> list[str]:
    """The engine's flags of a run's command line (less its output, data and timing), with what its tree chose."""
    return engine_flags(command) + RUN_SETTINGS


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
    for name, copy_bytes, tag in ((FOUR, 0.0, "4x"), (TWO, 4.0 * MODEL_PARAMS, "2x"), (ALL, 0.0, "all")):
        for run in json.loads((RESULTS / name).read_text())["runs"]:
            if run["system"] == "engine":
                step_ms, peak = measured(run)
                yield pytest.param(flags_of(run["command"]), step_ms, peak - copy_bytes / GIB,
                                   id=f"{tag}-{run['name']}")


def prediction(flags: list[str]):
    cfg = parse_config(flags)
    return predict(shape_of(cfg), CARDS["h200"], Setting.of(cfg, 1, 1, cfg.parallel.mp or 1), plan_of(flags))


def test_every_run_is_pinned():
    ids = [p.id for p in runs()]
    assert {"4x-gpu1_8k", "4x-cp4_32k", "4x-cp4_128k", "4x-cp2tp2_32k", "2x-cp2_32k", "2x-cp2_64k",
            "2x-cp2_128k", "all-cp4_16k", "all-cp4_64k", "all-cp4_32k_gather"} <= set(ids)
    assert set(STEP_MISSES) <= set(ids)
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


@pytest.mark.parametrize("flags, step_ms, peak", list(runs()))
def test_the_peak_is_within_10_percent_over_and_3_under(flags, step_ms, peak):
    predicted_gib = prediction(flags).peak / GIB
    assert -0.03 <= predicted_gib / peak - 1 <= 0.10, (predicted_gib, peak)


def test_the_float32_copy_is_of_the_shapes_own_parameters():
    run = json.loads((RESULTS / TWO).read_text())["runs"][0]
    shape = shape_of(parse_config(flags_of(run["command"])))
    assert sum(layer.params for layer in shape.layers) == MODEL_PARAMS
