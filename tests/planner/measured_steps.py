"""Every measured GPU step whose plan is known, as (name, the run's engine flags, ranks, measured ms): the flags are
the run's own command line less its paths and timing, plus the schedule it ran where the command left it to the
engine (its log's summary or plan line), so the planner can be asked for the same plan on the same grid.

Runs left out, by reason:
- a feature the cost model does not time: torch.compile (llama_1gpu_compile, llama_pp2tp2_compile), selective
  recompute (llama_1gpu_selective);
- not the engine: every peer run (Megatron, torch pipelining, DTensor, FSDP2);
- flags not the engine's defaults of their tree: the A/B's --fused-kernels off runs, L_dp2mp2_trace (--trace);
- no plan recorded: the 8B's pp4 and pp2 x tp2 steps of the issue's table (no results file holds their runs);
- skipped by their pass: grids-mlp's L_base, L_mp2_zb1m, L_dp4_bf16grads, L_mp2_chunks2*;
- the 2026-11-26 MLP matrices on 2 x H200: trees before the planner whose runs' flags live in per-job raw files.
"""
from __future__ import annotations

import json
import math
import re
import shlex
import tarfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results"
# The token files of every pass hold a 32000-token vocabulary (experiments/passes/pass_lib.sh write_tokens): the
# Llama takes it as a flag, the GPT from its data (the test stands in for data_vocab).
VOCAB = ["--vocab-size", "32000"]
DROPPED_WITH_VALUE = ("--metrics", "--data", "--steps", "--warmup", "--seed", "--trace", "--lr")
DROPPED = ("--quiet",)
# The plan-pass configurations (experiments/passes/plan_pass.sh) and the A/B's models (engine_ab.sh).
L = "--dim 8192 --depth 16 --batch-size 1024 --amp fp16"
C = "--dim 8192 --depth 8 --batch-size 64 --amp fp16"
G = "--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --batch-size 16 --amp bf16"
AB_LLAMA = ("--model llama --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048 "
            "--batch-size 16 --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 --amp bf16 --micro-batches 8")
AB_GPT = ("--model gpt --hidden 2560 --layers 12 --heads 20 --seq-len 1024 --batch-size 32 --optimizer adamw "
          "--amp bf16 --micro-batches 8")
AB_GRIDS = {"1gpu": ("", 1), "pp2tp2": ("--pp 2 --mp 2", 4), "pp4": ("--pp 4", 4), "tp4": ("--mp 4", 4),
            "tp2": ("--mp 2", 2)}
# The plan each A/B run of the new tree printed ("plan: ... (as flags: ...)" in its log, raw/*-logs.tgz): 1f1b
# named, the rest the planner's.
AB_PLANS = {("llama", "1gpu"): "--lookahead 0", ("llama", "pp2tp2"): "--lookahead 1",
            ("llama", "pp4"): "--lookahead 1", ("llama", "tp4"): "--lookahead 0",
            ("gpt", "1gpu"): "--lookahead 0", ("gpt", "pp2tp2"): "--lookahead 0", ("gpt", "pp4"): "--lookahead 0",
            ("gpt", "tp4"): "--lookahead 0", ("gpt", "tp2"): "--lookahead 0"}
AB_FILES = ("4xH200-engine-ab-llama", "4xH200-engine-ab-gpt", "4xH200-engine-ab-gpt-pp2tp2-repeat",
            "4xH200-engine-ab-gpt-fused-on", "4xH200-engine-ab-llama-fused-on", "2xH200-engine-ab-gpt-tp2")


def engine_flags(command: str) -> list[str]:
    """The engine's flags of a run's command line, less its output, data and timing flags; a flag given twice keeps
    its last value (the driver's parser does the same)."""
    words = shlex.split(command)
    words = words[words.index("hybrid_engine.py") + 1:]
    flags, i = [], 0
    while i < len(words):
        if words[i] in DROPPED_WITH_VALUE:
            i += 2
        elif words[i] in DROPPED:
            i += 1
        else:
            if words[i].startswith("--") and words[i] in flags and i + 1 < len(words) and \
                    not words[i + 1].startswith("--"):
                at = flags.index(words[i])
                del flags[at:at + 2]
            flags.append(words[i])
            i += 1
    return flags


def load(name: str) -> dict:
    """A results file by its name less its date (the newest of 2026-11-28, -27 and -26 that holds it)."""
    path = next(p for day in (28, 27, 26) if (p := RESULTS / f"2026-11-{day}-{name}.json").exists())
    return json.loads(path.read_text())


def card_of(name: str) -> str:
    """The card a results file's runs ran on, by its name (2xH100-..., 4xH200-...)."""
    return "h100" if "xH100" in name else "h200"


def grid_runs(name: str, skip: tuple[str, ...], schedule: list[str]):
    """The engine runs of a grids or Llama results file (a "cmd" each), less `skip`; schedule: the flags of the
    schedule its tree ran when the command named none (its logs' summaries: "schedule 1f1b")."""
    for key, run in load(name)["runs"].items():
        if "step_ms" not in run or "hybrid_engine.py" not in run.get("cmd", "") or key in skip:
            continue
        flags = engine_flags(run["cmd"])
        if "--schedule" not in flags:
            flags += schedule
        ranks = run.get("gpus") or math.prod(int(flags[flags.index(f) + 1]) for f in ("--dp", "--pp", "--mp")
                                             if f in flags)
        yield name, key, flags + (VOCAB if "llama" in flags and "--vocab-size" not in flags else []), ranks, \
            run["step_ms"]


def plan_runs(name: str, ranks: int):
    """The plan pass's runs: each its configuration, its grid and the plan it ran (as flags)."""
    for key, run in load(name)["runs"].items():
        config, grid = key[0], {"1": "", "4": "--pp 4"}[str(ranks)]
        if key.startswith("G_dp4"):
            grid = "--dp 4"
        flags = f"{ {'L': L, 'C': C, 'G': G}[config]} {grid} {run['plan']}".split()
        yield name, key, flags, ranks, run["step_time_s"] * 1e3


def ab_runs():
    """The new tree's runs of each engine A/B (its default flags, 1f1b named, 8 micro-batches)."""
    for name in AB_FILES:
        data = load(name)
        for key, row in data["median_step_ms"].items():
            grid_name = key.removesuffix("_2")
            if grid_name not in AB_GRIDS or row.get("new_ms") is None:
                continue
            grid, ranks = AB_GRIDS[grid_name]
            flags = (f"{AB_LLAMA if data['phase'] == 'llama' else AB_GPT} {grid} --schedule 1f1b "
                     f"{AB_PLANS[data['phase'], grid_name]}").split()
            yield name, key, flags + (VOCAB if data["phase"] == "llama" else []), ranks, row["new_ms"]


def gpt_dp_runs():
    """The GPT-1B at dp2 on 2 x H200, strong and weak scaling, with and without ZeRO-1, beside its one-GPU run:
    each run's flags from experiments/passes/gpt_dp_pass.sh (the file records no command line)."""
    gpt = "--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --amp bf16 --optimizer adamw --schedule 1f1b"
    flags = {"gpt_single": ("--batch-size 16 --micro-batches 8", 1),
             "gpt_dp2": ("--dp 2 --batch-size 16 --micro-batches 4", 2),
             "gpt_dp2_zero": ("--dp 2 --batch-size 16 --micro-batches 4 --zero 1", 2),
             "gpt_dp2w": ("--dp 2 --batch-size 32 --micro-batches 8", 2),
             "gpt_dp2w_zero": ("--dp 2 --batch-size 32 --micro-batches 8 --zero 1", 2)}
    for key, run in load("2xH200-gpt-dp")["runs"].items():
        grid, ranks = flags[key]
        yield "2xH200-gpt-dp", key, f"{gpt} {grid}".split(), ranks, run["step_ms"]


# The ZeRO passes' 8B shape (experiments/passes/zero_sharding_pass.sh): 16 sequences of 4096 tokens a step.
LLAMA_8B = ("--model llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --ffn-hidden 14336 --seq-len 4096 "
            "--vocab-size 128256 --batch-size 16 --amp bf16 --optimizer adamw")


def _step_ms_8b(run: dict) -> float:
    """The 8B run's step: the batch's tokens over its rate."""
    return 16 * 4096 / run["tokens_s"] * 1e3


def zero_runs():
    """The 8B at dp4 on 4 x H200, zero 1, 2 and 3, 4 micro-batches, every fusion on (its logs)."""
    flags = f"{LLAMA_8B} --fused-kernels on --dp 4 --schedule 1f1b --micro-batches 4"
    for level in (1, 2, 3):
        run = load("4xH200-zero-sharding")["runs"]["zero1_uncapped" if level == 1 else f"zero{level}"]
        yield "4xH200-zero-sharding", f"zero{level}", f"{flags} --zero {level}".split(), 4, _step_ms_8b(run)


def zero_plan_runs():
    """The 8B under --memory-cap-gib 78 on 4 x H200, two jobs: zero 2 at dp4 and the plan command's first row (its
    grid from the plan line in its log: dp2 x pp2, zero 1), each with the plan its summary recorded."""
    grids = {"zero2": "--dp 4 --zero 2", "plan_auto": "--dp 2 --pp 2 --zero 1"}
    for job, data in enumerate(load("4xH200-zero-sharding-plans")["jobs"], 1):
        for key, run in data["runs"].items():
            if key in grids and "plan" in run:
                flags = f"{LLAMA_8B} --memory-cap-gib 78 {grids[key]} {run['plan']}".split()
                yield "4xH200-zero-sharding-plans", f"{key}_job{job}", flags, 4, _step_ms_8b(run)


def zero_plan_head_runs():
    """The plan command's first row for the 8B under --memory-cap-gib 78 again on 4 x H200 (dp2 x pp2, zero 1, beside
    FSDP2 and torchtitan compiled, after the fused loss's one-GEMM weight gradient), with the plan its log printed."""
    for key, run in load("4xH200-zero-sharding-plan-head")["runs"].items():
        if key == "plan_auto":
            flags = f"{LLAMA_8B} --memory-cap-gib 78 --dp 2 --pp 2 --zero 1 {run['plan']}".split()
            yield "4xH200-zero-sharding-plan-head", key, flags, 4, _step_ms_8b(run)


def h100_plan_runs():
    """The 8B plans that ran out of memory on 4 x H100 80 GB, again on 4 x H200 under --memory-cap-gib 78, each with
    the plan its log printed (every fusion on: auto's without tensor parallelism, the loss's with it)."""
    grids = {"plan_pp4": "--pp 4", "plan_pp2tp2": "--pp 2 --mp 2", "plan_tp4": "--mp 4"}
    for key, run in load("4xH200-zero-sharding-h100-plans")["runs"].items():
        flags = f"{LLAMA_8B} --plan-card h200 --memory-cap-gib 78 {grids[key]} {run['plan']}".split()
        yield "4xH200-zero-sharding-h100-plans", key, flags, 4, _step_ms_8b(run)


def graph_runs():
    """The graphs pass on 4 x H100: configs L and C, 1F1B, on one GPU and every 4-GPU grid, eager and graphed (each
    run's --cuda-graphs as it ran)."""
    for run in load("4xH100-graphs")["runs"]:
        grid = dict((axis[:2], int(axis[2:])) for axis in run["grid"].split())
        flags = (f"{ {'L': L, 'C': C}[run['config']]} --dp {grid['dp']} --pp {grid['pp']} --mp {grid['mp']} "
                 f"--schedule 1f1b --micro-batches {run['micro_batches']} --cuda-graphs {run['graphs']}").split()
        key = f"{run['config']}_{run['grid'].replace(' ', '')}_m{run['micro_batches']}_{run['graphs']}"
        yield "4xH100-graphs", key, flags, grid["dp"] * grid["pp"] * grid["mp"], run["median_step_ms"]


def pp4_schedule_runs():
    """The GPT at pp4 under each schedule the pass named, with the rest of the plan its log printed: on 4 x H100, and
    ZBV again on 4 x H200 (its compiled run left out)."""
    for name, skip in (("4xH100-pp4-schedules", ()), ("4xH200-pp4-schedules", ("engine_pp4_zbv_compile",))):
        for name, key, flags, ranks, step_ms in grid_runs(name, skip, []):
            v = 2 if flags[flags.index("--schedule") + 1] in ("zbv", "dualpipev") else 1
            yield name, key, flags + f"--virtual-stages {v} --lookahead 0 --no-merge-wgrad".split(), ranks, step_ms


def logged_runs(name: str, step_ms_of=lambda run: run["step_ms"], runs: tuple[str, ...] = (), vocab=VOCAB):
    """The engine runs of a results file whose logs (raw/<date>-<name>-logs.tgz) hold each run's command, its plan
    line ("as flags: ...") and its CUDA-graphs line: each planned with that plan and its stages as the run chose
    them (`auto` resolved to what it printed). runs: only these (default: every engine run the logs hold); vocab:
    the vocabulary flags of a Llama whose command takes it from its data."""
    data = load(name)
    logs = next(p for day in (28, 27) if (p := RESULTS / "raw" / f"2026-11-{day}-{name}-logs.tgz").exists())
    with tarfile.open(logs) as tar:
        texts = {m.name[2:]: tar.extractfile(m).read().decode() for m in tar.getmembers()
                 if m.isfile() and m.name.endswith((".cmd", ".log"))}
    for key, run in data["runs"].items():
        log, cmd = texts.get(f"{key}.log", ""), texts.get(f"{key}.cmd", "")
        if (runs and key not in runs) or "hybrid_engine.py" not in cmd or "summary:" not in log:
            continue
        plan = re.search(r"\(as flags: ([^)]*)\)", log)  # none where the command fixed every schedule flag
        graphs = "on" if re.search(r"^CUDA graphs on ", log, re.M) else "off"
        flags = engine_flags(cmd) + (plan[1].split() if plan else []) + ["--cuda-graphs", graphs]
        flags += vocab if "llama" in flags and "--vocab-size" not in flags else []
        ranks = math.prod(int(flags[flags.index(f) + 1]) for f in ("--dp", "--pp", "--mp", "--cp") if f in flags)
        yield name, key, flags, ranks, step_ms_of(run)


def measured_steps():
    """Every point: (results file, run, flags, ranks, measured step ms), each planned eager or graphed as it ran (every
    run before the graphs pass predates CUDA-graphed stages) and with its stages' blocks whole or cut as it ran
    (every run before the split-blocks pass placed whole blocks)."""
    for name, run, flags, ranks, step_ms in _graphs_as_run():
        yield name, run, flags + ["--split-blocks", "off"], ranks, step_ms
    # the GPT at pp4 with stages ending inside blocks where auto chose it, beside whole blocks
    yield from logged_runs("4xH200-pp4-schedules-split-blocks")
    # the Llama-1B class at pp4 and pp2 x tp2 graphed, the same, beside whole blocks
    yield from logged_runs("4xH200-graphs-llama-split-blocks")


def _graphs_as_run():
    for name, run, flags, ranks, step_ms in _measured_steps():
        yield name, run, flags + ["--cuda-graphs", "off"], ranks, step_ms
    yield from graph_runs()
    # the Llama-1B class on one GPU, tp4, pp4 and pp2 x tp2, each --cuda-graphs off and on (named in its commands)
    yield from grid_runs("4xH200-graphs-llama", (), [])
    # the same grids again, graphed where auto chose it, and tp4 eager beside them
    yield from logged_runs("4xH200-graphs-llama-auto")
    # the Llama-1B class on one GPU under auto (graphed) and eager, beside its peers (its compiled run not timed)
    yield from logged_runs("1xH200-llama-1gpu-graphed-peers", runs=("llama_1gpu", "llama_1gpu_eager"))
    # the GPT at pp4: zbv (eager: its W actions), 1f1b and interleaved graphed by auto, and auto's own plan
    yield from logged_runs("4xH200-pp4-schedules-graphs-auto")
    # zbv with its I actions graphed by auto beside zbv eager, a later job
    yield from logged_runs("4xH200-pp4-schedules-zbv-graphed")
    # the 8B's plan for a 78 GiB card graphed and eager on the H200s' own memory, and under auto with the cap
    vocab_8b = ["--vocab-size", "128256"]
    yield from logged_runs("4xH200-zero-sharding-plan-graphed-uncapped", _step_ms_8b, vocab=vocab_8b)
    yield from logged_runs("4xH200-zero-sharding-plan-auto-cap", _step_ms_8b, vocab=vocab_8b)


def _measured_steps():
    yield from grid_runs("4xH200-grids-mlp", ("L_dp2mp2_trace",), [])
    yield from grid_runs("4xH200-grids-gpt", (), ["--schedule", "1f1b"])
    yield from grid_runs("2xH100-gpt-pp-tp", (), ["--schedule", "1f1b"])
    yield from gpt_dp_runs()
    yield from grid_runs("4xH200-llama-4gpu", ("llama_pp2tp2_compile",), ["--schedule", "1f1b"])
    yield from grid_runs("1xH200-llama-1gpu", ("llama_1gpu_compile", "llama_1gpu_selective"), ["--schedule", "1f1b"])
    yield from plan_runs("1xH200-plan-one", 1)
    yield from plan_runs("4xH200-plan-four", 4)
    yield from ab_runs()
    yield from zero_runs()
    yield from zero_plan_runs()
    yield from pp4_schedule_runs()
    # the 8B at pp4 on 4 x H100, bf16 and fp8 (kernels pass), each with the plan its log printed
    zbv = "--schedule zbv --virtual-stages 2 --lookahead 0 --no-merge-wgrad".split()
    yield from grid_runs("4xH100-kernels-8b-pp4", (), zbv)
    # the same on 4 x H200, fp8's quantization as compiled regions, then as Triton kernels (two jobs)
    yield from grid_runs("4xH200-kernels-8b-pp4-fp8-reuse", (), zbv)
    yield from grid_runs("4xH200-kernels-8b-pp4-fp8-kernels", (), zbv)
    # the 8B layer cut on one H200 each, this tree's runs of the head's A/B (1f1b named)
    yield from grid_runs("2xH200-transformer-step-head-ab", ("l4_bf16_old", "l4_fp8_old"), [])
    yield from zero_plan_head_runs()
    yield from h100_plan_runs()
