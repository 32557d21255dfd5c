"""Where the numbers README.md and docs/ show come from (tests/docs/test_doc_numbers.py holds each page to them): the
results files under experiments/results/, a job's log archive under raw/, and the rounding a page shows them with."""
from __future__ import annotations

import decimal
import functools
import json
import os
import re
import tarfile

from hybrid_engine.metrics import records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "results")


@functools.cache
def page(name: str) -> str:
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return " ".join(f.read().split())  # a table cell or sentence may wrap: compare with single spaces


@functools.cache
def results(name: str):
    path = os.path.join(RESULTS, name)
    with open(path, encoding="utf-8") as f:
        if name.endswith(".jsonl"):
            return [json.loads(line) for line in f]
        return json.load(f)


@functools.cache
def archive_member(archive: str, member: str) -> str:
    with tarfile.open(os.path.join(RESULTS, "raw", archive)) as tar:
        names = [n for n in tar.getnames() if os.path.basename(n) == member]
        assert len(names) == 1, (archive, member, names)
        return tar.extractfile(names[0]).read().decode()


def summary_ms(archive: str, log: str) -> float:
    """The median step time of a run's log in a job's archive (its `summary:` line)."""
    return float(re.search(r"^summary: .*median step ([0-9.]+) ms", archive_member(archive, log), re.M)[1])


def summary_rate(archive: str, log: str) -> float:
    """The samples (or tokens) a second of a run's log in a job's archive (its `summary:` line)."""
    return float(re.search(r"^summary: .*?([0-9.]+) (?:samples|tokens)/s", archive_member(archive, log), re.M)[1])


def json_line_field(archive: str, log: str, field: str) -> float:
    """A field of the last JSON line of a peer's log (the peers print their result as one)."""
    line = [ln for ln in archive_member(archive, log).splitlines() if ln.startswith("{")][-1]
    return json.loads(line)[field]


def profile_cuda_percent(archive: str, log: str, name: str) -> float:
    """A row's Self CUDA % in a torch.profiler table."""
    row = re.search(rf"^\s*{re.escape(name)}\s+(.*)$", archive_member(archive, log), re.M)[1].split()
    return float(row[6].rstrip("%"))


def profile_host_us_per_call(archive: str, log: str, names: tuple[str, ...]) -> float:
    """The host (CPU total) time per call of these rows of a torch.profiler table (its first, rank 0's), in µs."""
    total, calls = 0.0, 0
    for name in names:
        row = re.search(rf"^\s*{re.escape(name)}\s+(.*)$", archive_member(archive, log), re.M)[1].split()
        value, unit = re.fullmatch(r"([0-9.]+)(us|ms|s)", row[3]).groups()
        total += float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]
        calls += int(row[-1])
    return total / calls


def profile_calls(archive: str, log: str, name: str) -> int:
    row = re.search(rf"^\s*{re.escape(name)}\s+(.*)$", archive_member(archive, log), re.M)[1].split()
    return int(row[-1])


def mlp_run(system: str, config: str, mode: str, prec: str = "fp16", gpus: int = 2) -> dict:
    """A run of the MLP benchmark matrix (2 x H200): the first with these fields, the one its ratios use."""
    return next(r for r in results("2026-11-26-2xH200.json")["runs"] if (r["system"], r["config"], r["mode"],
                r["prec"], r["gpus"]) == (system, config, mode, prec, gpus))


def mlp(system: str, config: str, mode: str, prec: str = "fp16") -> float:
    return mlp_run(system, config, mode, prec)["samples_s"]


def mlp_ratios() -> dict:
    return results("2026-11-26-2xH200.json")["ratios"]


def max_batch(schedule: str, mode: str) -> int:
    return next(r["max_batch"] for r in results("2026-11-26-2xH200-maxbatch.jsonl")
                if r["kind"] == "result" and (r["schedule"], r["mode"]) == (schedule, mode))


def rounded(x: float, digits: int) -> str:
    """x to `digits` decimals as a person rounds its decimal digits (half up: 6260.5 -> 6261, 1.605 -> 1.61)."""
    return str(decimal.Decimal(repr(x)).quantize(decimal.Decimal(1).scaleb(-digits), decimal.ROUND_HALF_UP))


def comma(x: float) -> str:
    return f"{int(rounded(x, 0)):,}"


def fixed(digits: int):
    return lambda x: rounded(x, digits)


def pct(digits: int = 1):
    return lambda x: rounded(100 * x, digits)


def ratio(a: float, b: float, digits: int = 2) -> str:
    return rounded(a / b, digits)


LLAMA1 = "2026-11-27-1xH200-llama-1gpu.json"
LLAMA1_GRAPHED = "2026-11-28-1xH200-llama-1gpu-graphed-peers.json"  # graphs auto, beside HF compiled
GPT1 = "2026-11-26-1xH200-gpt.json"
PPTP = "2026-11-26-2xH100-gpt-pp-tp.json"
GRIDS_GPT, GRIDS_MLP = "2026-11-27-4xH200-grids-gpt.json", "2026-11-27-4xH200-grids-mlp.json"
PLAN1, PLAN4 = "2026-11-27-1xH200-plan-one.json", "2026-11-27-4xH200-plan-four.json"
FIRST = "cpu/2026-11-27-first-ten-minutes.json"
PERF, PLANNING = "docs/performance.md", "docs/planning.md"
GPT_DP, LLAMA4 = "2026-11-26-2xH200-gpt-dp.json", "2026-11-27-4xH200-llama-4gpu.json"
ZERO_SCALING, ZERO_OVERLAP = "2026-11-26-2xH100-zero-scaling-logs.tgz", "2026-11-26-2xH100-zero-overlap-logs.tgz"
PROFILE = "2026-11-26-1xH100-profile-gpt-logs.tgz"


def llama(run: str, file: str = LLAMA1) -> float:
    return results(file)["runs"][run]["per_s"]


def pptp(run: str) -> float:
    return results(PPTP)["runs"][run]["tokens_s"]


def gpt1_ratio(peer: str) -> str:
    return ratio(results(GPT1)["engine"]["gpt_bf16_1f1b"]["tokens_s"], results(GPT1)["peers"][peer]["tokens_s"])


def peak_errors(prefix: str, four: bool) -> list[float]:
    runs = results(PLAN4 if four else PLAN1)["runs"]
    return [abs(r["peak_error"]) for name, r in runs.items() if name.startswith(prefix)]


def grid_mlp(run: str) -> str:
    """A 4 x H200 MLP grid's throughput over the one-GPU run of the same flags its results file names."""
    data = results(GRIDS_MLP)
    return ratio(data["runs"][run]["per_s"], data["runs"][data["ratios"][run]["baseline"]]["per_s"])


def grid_gpt(run: str, over: str = "gpt_1gpu") -> str:
    runs = results(GRIDS_GPT)["runs"]
    return ratio(runs[run]["per_s"], runs[over]["per_s"])


def zero_scaling(schedule: str, strong: bool) -> float:
    """dp=2 against one H100 of the same job: strong keeps the global batch (twice the GPUs for the same rows),
    weak the per-replica batch."""
    one = summary_ms(ZERO_SCALING, f"L_dp1_{schedule}.log")
    two = summary_ms(ZERO_SCALING, f"L_dp2_zero_{'' if strong else 'weak_'}{schedule}.log")
    return one / (2 * two) if strong else one / two


def first_loss(i: int) -> str:
    return f"{results(FIRST)['validation_loss'][i][1]:.4f}"


JOB3, JOB7 = "raw/2026-11-26-2xH200-job3.json", "raw/2026-11-26-2xH200-job7.json"
JOB9 = "2026-11-26-4xH200-job9-logs.tgz"
ZERO_PASS, MAXBATCH = "2026-11-26-2xH200-zero.json", "2026-11-26-2xH200-maxbatch.jsonl"
GRIDS_MLP_FIRST = "raw/2026-11-27-4xH200-grids-mlp-first-job.json"
GRIDS_MLP_LOGS, COMPILE_AB = "2026-11-27-4xH200-grids-mlp-logs.tgz", "2026-11-26-1xH200-gpt-compile-ab-logs.tgz"
SP_AB, LLAMA4_LOGS = "2026-11-26-2xH100-sp-ab-logs.tgz", "2026-11-27-4xH200-llama-4gpu-logs.tgz"
LLAMA_TEXT = "cpu/2026-11-27-llama-vs-gpt-text.json"
MAIN_JOB, CLEAN_CI = "cpu/2026-11-27-main-job.json", "cpu/2026-11-28-clean-clone-ci.json"
LONG_SEQ4, LONG_SEQ4_ALL = "2026-11-27-4xH200-long-seq.json", "2026-11-27-4xH200-long-seq-cp4-all.json"
LONG_SEQ4_CUDNN = "2026-11-28-4xH200-long-seq.json"  # every run again, the blocks by cuDNN's kernel
ZERO_DP4, ZERO_PLANS = "2026-11-27-4xH200-zero-sharding.json", "2026-11-27-4xH200-zero-sharding-plans.json"
ZERO_HEAD = "2026-11-27-4xH200-zero-sharding-plan-head.json"


def long_seq4(name: str, file: str = LONG_SEQ4_CUDNN) -> dict:
    """A run of a 4 x H200 long-sequence job by its name (the job of cuDNN's blocks by default; LONG_SEQ4_ALL: the
    flash blocks' at 16k-64k)."""
    return next(r for r in results(file)["runs"] if r["name"] == name)


def zero_dp4(run: str) -> dict:
    """A run of the 8B ZeRO levels at dp4 (4 x H200)."""
    return results(ZERO_DP4)["runs"][run]


def zero_plans(run: str, job: int = 1) -> dict:
    """A run of the 8B plans' jobs under the 78 GiB cap (the second: the planner's plan beside the peers)."""
    return results(ZERO_PLANS)["jobs"][job]["runs"][run]


def zero_head(run: str) -> dict:
    """A run of the third 8B plan job under the 78 GiB cap (after the fused loss's one-GEMM weight gradient)."""
    return results(ZERO_HEAD)["runs"][run]


def job_run(job: str, config: str, mode: str, variant: str = "") -> dict:
    """A run of one of the MLP jobs' own results files (each dp=2 run beside its 1-GPU run of the same job)."""
    return next(r for r in results(job)["runs"] if (r["config"], r["mode"], r["variant"]) == (config, mode, variant))


def job7_efficiency(config: str, variant: str) -> float:
    """dp=2 samples/s over twice job 7's one GPU of the same schedule: strong at config L, weak at Lw."""
    single = job_run(JOB7, "L", "single", "zb1m" if variant.startswith("zb1m") else "")
    return job_run(JOB7, config, "dp", variant)["samples_s"] / (2 * single["samples_s"])


def trace_events(archive: str, member: str) -> list[dict]:
    return [e for e in json.loads(archive_member(archive, member))["traceEvents"] if e.get("ph") == "X"]


def forward_mp_all_reduces_us(archive: str, member: str) -> list[float]:
    """The forward's MP all-reduces of a traced step (those that start before its first backward), in µs, in order."""
    events = trace_events(archive, member)
    backward = min(e["ts"] for e in events if e.get("cat") == "B")
    return [e["dur"] for e in sorted(events, key=lambda e: e["ts"]) if e["pid"] == 2 and e["ts"] < backward]


def reduce_scatter_span_ms(archive: str, member: str) -> float:
    rs = [e for e in trace_events(archive, member) if e.get("cat") == "reduce_scatter"]
    return (max(e["ts"] + e["dur"] for e in rs) - min(e["ts"] for e in rs)) / 1e3


def last_backward_ms(archive: str, member: str) -> float:
    return [e for e in trace_events(archive, member) if e.get("cat") == "B"][-1]["dur"] / 1e3


def gpu_idle_fraction(archive: str, log: str) -> float:
    """1 - GPU busy / step of a profile's `GPU busy X ms per step of Y ms` line."""
    busy, step = re.search(r"GPU busy ([0-9.]+) ms per step of ([0-9.]+) ms", archive_member(archive, log)).groups()
    return 1 - float(busy) / float(step)


def timed_step_ms(archive: str, jsonl: str) -> list[float]:
    """Every step time of a run's metrics file in a job's archive, warm-up included, in ms."""
    return [1e3 * r["step_time_s"] for r in records.steps(records.parse(archive_member(archive, jsonl)))]


def mlp_l_bytes(bytes_per_value: int) -> float:
    """Config L's weights (16 layers of 8192 x 8192) at a width, in GB: what a step moves for one full copy."""
    return 16 * 8192 * 8192 * bytes_per_value / 1e9


def first_median_step_ms() -> float:
    """The first-ten-minutes run's median step (its summary line)."""
    return float(re.search(r"median step ([0-9.]+) ms", results(FIRST)["summary"])[1])
