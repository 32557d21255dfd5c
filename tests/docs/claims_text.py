"""The numbers README.md and docs/ state in sentences, and the table rows and columns the result tables' claims in
test_doc_numbers.py leave: the same form (the page, the text as shown with {} for each number, a callable giving each
number as shown), read from the results file or job archive the sentence names."""
from __future__ import annotations

import json
import re

from doc_sources import (CLEAN_CI, COMPILE_AB, FIRST, GRIDS_MLP, GRIDS_MLP_FIRST, GRIDS_MLP_LOGS, JOB3, JOB9, LLAMA1,
                         LLAMA4, LLAMA4_LOGS, LLAMA_TEXT, MAIN_JOB, MAXBATCH, PERF, PPTP, PROFILE, SP_AB, ZERO_OVERLAP,
                         ZERO_PASS, archive_member, comma, first_median_step_ms, fixed, forward_mp_all_reduces_us,
                         gpu_idle_fraction, job7_efficiency, job_run, last_backward_ms, llama, mlp_l_bytes,
                         mlp_ratios, pct, pptp, profile_cuda_percent, ratio, reduce_scatter_span_ms, results, rounded,
                         summary_ms, summary_rate, timed_step_ms, long_seq4, zero_dp4, zero_plans,
                         zero_head)

from claims_step_text import LONG_SEQ_DOC, STEP_CLAIMS

LLAMA_DOC = "docs/llama.md"
COMMAND_TIMES = "cpu/2026-11-27-readme-command-times.json"
DOCS_COMMAND_TIMES = "cpu/2026-11-27-docs-command-times.json"
ZB1_AHEAD1 = "engine_pp2_zb1m_ahead1"
LLAMA4_GOAL = "pp2 x tp2 >= 2x Megatron-core on the same grid"


def _pipeline_slowdown() -> float:
    """The largest step-time ratio of a pipeline grid between the second 4 x H200 machine and the first."""
    first, second = results(GRIDS_MLP_FIRST)["runs"], results(GRIDS_MLP)["runs"]
    return max(second[k]["step_ms"] / first[k]["step_ms"] for k in first
               if "pp" in k and k in second and first[k].get("step_ms") and second[k].get("step_ms"))


def _one_gpu_agreement() -> str:
    first, second = results(GRIDS_MLP_FIRST)["runs"], results(GRIDS_MLP)["runs"]
    worst = max(abs(second[k]["step_ms"] / first[k]["step_ms"] - 1) for k in first if "_1gpu_" in k)
    return "2" if worst <= 0.02 else f"{100 * worst:.1f}"


def _converged_within() -> str:
    reasons = {r["reason"] for r in results(MAXBATCH) if r["kind"] == "result" and r["converged"]}
    assert all(r["converged"] for r in results(MAXBATCH) if r["kind"] == "result") and len(reasons) == 1, reasons
    return reasons.pop().split("within ")[1].rstrip("%")


def _two_gpu_row(label: str, run: str, engine: str | None) -> tuple:
    cells = [lambda: comma(pptp(run)), lambda: pct()(results(PPTP)["runs"][run]["mfu"])]
    if engine is None:
        return (PERF, f"| {label} | {{}} ({{}}%) | — |", *cells)
    return (PERF, f"| {label} | {{}} ({{}}%) | {{}}× |", *cells, lambda: ratio(pptp(engine), pptp(run)))


ZERO_DP4_LOGS = "2026-11-27-4xH200-zero-sharding-logs.tgz"


# docs/long_sequences.md's table: (the row's label, the run of the job of cuDNN's blocks)
LONG_SEQ_ROWS = (("one GPU, 8k", "gpu1_8k"), ("cp4, 16k", "cp4_16k"),
                 ("cp4, 16k, `--cp-comm all-gather`", "cp4_16k_gather"), ("cp4, 32k", "cp4_32k"),
                 ("cp4, 32k, `--cp-kernel flash`", "cp4_32k_flash"),
                 ("cp4, 32k, `--cp-comm all-gather`", "cp4_32k_gather"),
                 ("cp2 × tp2, 32k", "cp2tp2_32k"), ("cp4, 64k", "cp4_64k"), ("cp4, 128k", "cp4_128k"),
                 ("torch's `context_parallel`, cp4, 32k", "torch_cp4_32k"))


def _llama4(run: str) -> dict:
    return results(LLAMA4)["runs"][run]


def _llama1(run: str) -> dict:
    return results(LLAMA1)["runs"][run]


def _llama_row(label: str, table: str, run: str, bold: bool = False) -> tuple:
    """A row of docs/llama.md's GPU tables: tokens/s, MFU and the peak memory of the largest rank."""
    data = (lambda: _llama1(run)) if table == LLAMA1 else (lambda: _llama4(run))
    tokens = "**{}**" if bold else "{}"
    return (LLAMA_DOC, f"| {label} | {tokens} | {{}}% | {{}} |", lambda: comma(data()["per_s"]),
            lambda: pct()(data()["mfu"]), lambda: fixed(1)(max(data()["peak_gib"])))


def _loss_tolerance() -> str:
    """The two-GPU job's loss tolerance, where every engine and torch peer run kept to it (Megatron draws its own
    initial weights)."""
    data = results(PPTP)
    checked = {run: c for run, c in data["loss_check"].items() if not run.startswith("megatron")}
    assert all(c["within"] for c in checked.values()), checked
    return f"{data['loss_tolerance']['max_rel_diff']:.0e}".replace("e-03", "e-3")


def _job9_loss_agreement() -> str:
    """The largest gap between the base code's printed step losses and both engine runs' (dp2 x pp2, 4 x H200)."""
    base = [float(x) for x in re.findall(r"^step\s+\d+\s+loss ([0-9.]+)", archive_member(JOB9, "base_dp2.log"), re.M)]
    base = base[::2]  # its two processes print each step
    gaps = [abs(json.loads(line)["loss"] - b) for run in ("engine_dp2pp2.jsonl", "engine_dp2pp2_1f1b.jsonl")
            for line, b in zip(archive_member(JOB9, run).splitlines(), base)]
    assert len(gaps) == 16, gaps
    return "1e-6" if max(gaps) <= 1e-6 else f"{max(gaps):.0e}"


def _target(name: str, goal: str) -> dict:
    return results(name)["targets"][goal]


def _verdict(name: str, goal: str) -> str:
    return "met" if _target(name, goal)["met"] else "missed"


def _llama4_timed_ms() -> list[float]:
    """The step times the 4-GPU engine run's median is taken over (its last `timed_steps`)."""
    return timed_step_ms(LLAMA4_LOGS, "llama_pp2tp2.jsonl")[-_llama4("llama_pp2tp2")["timed_steps"]:]


def _command_s(run: str) -> str:
    return rounded(results(COMMAND_TIMES)["runs"][run]["wall_s"], 0)


def _docs_command_s(*runs: str) -> str:
    return rounded(sum(results(DOCS_COMMAND_TIMES)["runs"][run]["wall_s"] for run in runs), 0)


def _text_run(model: str) -> dict:
    return results(LLAMA_TEXT)["runs"][model]


CLAIMS = [
    # README.md: the main job's loss, the clean clone's times
    ("README.md", "Its loss falls from {} to {} in its 10 steps.",
     lambda: fixed(3)(results(MAIN_JOB)["loss"][0][1]), lambda: fixed(3)(results(MAIN_JOB)["loss"][9][1])),
    ("README.md", "# ~{} s for the set-up ({} s of it the build) and ~{} s for the job",
     lambda: str(results(CLEAN_CI)["setup_s"]), lambda: str(results(CLEAN_CI)["build_s"]),
     lambda: rounded(results(MAIN_JOB)["wall_s"], 0)),
    ("README.md", "# 2. the tests (CI runs exactly this, .ci/run): ~{} min on 2 cores",
     lambda: str(results(CLEAN_CI)["tests_min"])),
    ("README.md", "~{} min on 2 cores # shared with other work (a median step of {} ms)",
     lambda: rounded(800 * first_median_step_ms() / 60e3, 0),
     lambda: rounded(first_median_step_ms(), 0)),
    # docs/performance.md: sentences
    (PERF, "took zb1 at config L from {}k to {}k samples/s; lookahead 2 gave {}k "
     "(experiments/results/raw/2026-11-26-2xH200-job3.json)",
     *[lambda v=v: fixed(1)(job_run(JOB3, "L", "zb1", v)["samples_s"] / 1e3) for v in ("ahead0", "", "ahead2")]),
    (PERF, "the same schedule idles within {}–{}% of the trace",
     lambda: pct(0)(mlp_ratios()["L_pp2_fp32_1f1b_bubble_traced_over_calibrated"] - 1),
     lambda: pct(0)(mlp_ratios()["L_pp2_fp16_1f1b_bubble_traced_over_calibrated"] - 1)),
    (PERF, "every search converged within {}%", _converged_within),
    (PERF, "| 1f1b, `--dp-grad-dtype bf16` (gradients rounded to bf16 on the wire) | {}% | {}% | "
     "| zb1 + merged W, replicated | {}% | {}% |",
     lambda: pct(0)(job7_efficiency("L", "bf16wire")), lambda: pct(0)(job7_efficiency("Lw", "bf16wire")),
     lambda: pct(0)(job7_efficiency("L", "zb1m")), lambda: pct(0)(job7_efficiency("Lw", "zb1m"))),
    (PERF, "the ≈ {} GB fp32 reduce-scatter and ≈ {} GB all-gather per step bound it",
     lambda: fixed(1)(mlp_l_bytes(4) / 2), lambda: fixed(0)(mlp_l_bytes(2) / 2)),
    (PERF, "the last micro-batch's backward (≈ {} ms), which cannot hide ≈ {} ms of reduce-scatters",
     lambda: fixed(1)(last_backward_ms(ZERO_OVERLAP, "trace_L_dp2_zero_1f1b.json")),
     lambda: fixed(0)(reduce_scatter_span_ms(ZERO_OVERLAP, "trace_L_dp2_zero_1f1b.json"))),
    (PERF, "`--zero 1` costs nothing on one GPU ({} → {} ms), holds {} GiB less per rank at dp=2",
     lambda: fixed(2)(results(ZERO_PASS)["runs"]["L_single_1f1b"]["median_step_ms"]),
     lambda: fixed(2)(results(ZERO_PASS)["runs"]["L_single_zero_1f1b"]["median_step_ms"]),
     lambda: fixed(2)(results(ZERO_PASS)["runs"]["L_dp2_1f1b"]["peak_gib"][0]
                      - results(ZERO_PASS)["runs"]["L_dp2_zero_1f1b"]["peak_gib"][0])),
    (PERF, "bound by its fp32 gradients (L: {} GB a step)", lambda: fixed(1)(mlp_l_bytes(4))),
    *[(PERF, f"| {label} | {{}} | {{}}% | {{}} |", lambda run=run: comma(zero_dp4(run)["tokens_s"]),
       lambda run=run: pct()(zero_dp4(run)["mfu"]), lambda run=run: fixed(1)(zero_dp4(run)["peak_gib"]))
      for label, run in (("`--zero 1` (no cap)", "zero1_uncapped"), ("`--zero 2`", "zero2"), ("`--zero 3`", "zero3"),
                         ("FSDP2 on Hugging Face's Llama, compiled", "fsdp2_compile"))],
    (PERF, "within an H100's memory at {}× FSDP2 compiled, zero 3 at {}×",
     lambda: ratio(zero_dp4("zero2")["tokens_s"], zero_dp4("fsdp2_compile")["tokens_s"]),
     lambda: ratio(zero_dp4("zero3")["tokens_s"], zero_dp4("fsdp2_compile")["tokens_s"])),
    (PERF, "their steps are {} and {} ms longer than zero 1's",
     *[lambda z=z: fixed(0)(summary_ms(ZERO_DP4_LOGS, f"zero{z}.log") - summary_ms(ZERO_DP4_LOGS, "zero1_uncapped.log"))
       for z in (2, 3)]),
    *[(PERF, f"| {label} | {{}} | {{}} |", lambda run=run: comma(zero_plans(run)["tokens_s"]),
       lambda run=run: fixed(1)(zero_plans(run)["peak_gib"]))
      for label, run in (("the planner's plan: dp2 × pp2, `--zero 1`", "plan_auto"),
                         ("FSDP2 on Hugging Face's Llama, compiled", "fsdp2_compile"),
                         ("torchtitan, eager (its CUDA graphs)", "torchtitan_eager"),
                         ("torchtitan, compiled (without CUDA graphs)", "torchtitan_compile"))],
    (PERF, "The planner's plan reaches {}% MFU: {}× FSDP2 compiled ({} unrounded) and {}× torchtitan eager, {}×",
     lambda: pct()(zero_plans("plan_auto")["mfu"]),
     lambda: ratio(zero_plans("plan_auto")["tokens_s"], zero_plans("fsdp2_compile")["tokens_s"]),
     lambda: ratio(zero_plans("plan_auto")["tokens_s"], zero_plans("fsdp2_compile")["tokens_s"], 3),
     lambda: ratio(zero_plans("plan_auto")["tokens_s"], zero_plans("torchtitan_eager")["tokens_s"]),
     lambda: ratio(zero_plans("plan_auto")["tokens_s"], zero_plans("torchtitan_compile")["tokens_s"])),
    *[(PERF, f"| {label} | {{}} | {{}}% | {{}} |", lambda run=run: comma(zero_head(run)["tokens_s"]),
       lambda run=run: pct()(zero_head(run)["mfu"]), lambda run=run: fixed(1)(zero_head(run)["peak_gib"]))
      for label, run in (("the planner's plan: dp2 × pp2, `--zero 1`", "plan_auto"),
                         ("FSDP2 on Hugging Face's Llama, compiled", "fsdp2_compile"),
                         ("torchtitan, compiled (without CUDA graphs)", "torchtitan_compile"))],
    (PERF, "The plan is {}× FSDP2 compiled and {}× torchtitan compiled, its step {} s against the planner's {}.",
     lambda: ratio(zero_head("plan_auto")["tokens_s"], zero_head("fsdp2_compile")["tokens_s"]),
     lambda: ratio(zero_head("plan_auto")["tokens_s"], zero_head("torchtitan_compile")["tokens_s"]),
     lambda: fixed(2)(16 * 4096 / zero_head("plan_auto")["tokens_s"]),
     lambda: fixed(2)(zero_head("plan_auto")["predicted_step_s"])),
    (PERF, "torchtitan shards everything yet keeps within {}% of a plan",
     lambda: fixed(0)(100 * (zero_head("plan_auto")["tokens_s"] / zero_head("torchtitan_compile")["tokens_s"] - 1))),
    (PERF, "In the first job zero 2 at dp4 ran {} tokens/s beside the same plan's {}.",
     lambda: comma(zero_plans("zero2", 0)["tokens_s"]), lambda: comma(zero_plans("plan_auto", 0)["tokens_s"])),
    *[(LONG_SEQ_DOC, f"| {label} | {{}} | {{}}% | {{}}% | {{}} |", lambda run=run: comma(long_seq4(run)["tokens_s"]),
       lambda run=run: pct()(long_seq4(run)["mfu"]), lambda run=run: pct()(long_seq4(run)["mfu_causal"]),
       lambda run=run: fixed(1)(max(long_seq4(run).get("peak_gib_per_gpu") or long_seq4(run)["peak_gib"])))
      for label, run in LONG_SEQ_ROWS],
    (LONG_SEQ_DOC, "At 32k cp4 is {}× torch's context parallelism (the goal is 1.2×; torch's ran cuDNN's kernels "
     "too) and its MFU is {} of one GPU's at 8k (the goal is 0.9); the blocks by cuDNN's kernel are {}× the same run "
     "by flash's. A sequence of 128k tokens trains on four GPUs at {} GiB each. The all-gather variant is {}× the ring "
     "at 32k",
     lambda: ratio(long_seq4("cp4_32k")["tokens_s"], long_seq4("torch_cp4_32k")["tokens_s"]),
     lambda: ratio(long_seq4("cp4_32k")["mfu"], long_seq4("gpu1_8k")["mfu"]),
     lambda: ratio(long_seq4("cp4_32k")["tokens_s"], long_seq4("cp4_32k_flash")["tokens_s"]),
     lambda: fixed(1)(max(long_seq4("cp4_128k")["peak_gib_per_gpu"])),
     lambda: ratio(long_seq4("cp4_32k_gather")["tokens_s"], long_seq4("cp4_32k")["tokens_s"])),
    (LONG_SEQ_DOC, "At 16k (4k tokens a rank) the all-gather variant is {}× the ring",
     lambda: ratio(long_seq4("cp4_16k_gather")["tokens_s"], long_seq4("cp4_16k")["tokens_s"])),
    (PERF, "Zero 3's peak is {}% of zero 1's",
     lambda: pct(0)(zero_dp4("zero3")["peak_gib"] / zero_dp4("zero1_uncapped")["peak_gib"])),
    (PERF, "(after the first, each of 8 MB took {}–{} µs in the dp2 × mp2 trace",
     lambda: f"{min(forward_mp_all_reduces_us(GRIDS_MLP_LOGS, 'L_dp2mp2_trace.json')[1:]):.0f}",
     lambda: f"{max(forward_mp_all_reduces_us(GRIDS_MLP_LOGS, 'L_dp2mp2_trace.json')[1:]):.0f}"),
    (PERF, "The pipeline grids ran up to {}× slower on this machine than on another H200 machine the same day (L pp4 "
     "{} vs {} ms, same code, 1-GPU runs within {}%",
     lambda: fixed(2)(_pipeline_slowdown()), lambda: fixed(2)(results(GRIDS_MLP_FIRST)["runs"]["L_pp4"]["step_ms"]),
     lambda: fixed(2)(results(GRIDS_MLP)["runs"]["L_pp4"]["step_ms"]), _one_gpu_agreement),
    (PERF, "the GPU idles about {}% of the step waiting for the host",
     lambda: pct(0)(gpu_idle_fraction(PROFILE, "profile_gpt.txt"))),
    (PERF, "is slower, {} ms against {} ms per step",
     lambda: fixed(0)(summary_ms(COMPILE_AB, "gpt_bf16_1f1b_compile.log")),
     lambda: fixed(0)(summary_ms(COMPILE_AB, "gpt_bf16_1f1b.log"))),
    (PERF, "flat collectives took that step from {} to {}–{} ms",
     lambda: fixed(0)(summary_ms(SP_AB, "tp2_sp_list.log")),
     lambda: fixed(0)(min(summary_ms(SP_AB, f"tp2_sp_flat{s}.log") for s in ("", "_again"))),
     lambda: fixed(0)(max(summary_ms(SP_AB, f"tp2_sp_flat{s}.log") for s in ("", "_again")))),
    (PERF, "Missed: ≥ 1.3× torch pipelining ({}×)", lambda: ratio(pptp(ZB1_AHEAD1), pptp("torch_pp_compile"))),
    # docs/performance.md: the two-GPU table, every row with its ratio column
    _two_gpu_row("torch.distributed.pipelining 1F1B, blocks compiled", "torch_pp_compile", ZB1_AHEAD1),
    _two_gpu_row("torch.distributed.pipelining 1F1B, eager", "torch_pp", ZB1_AHEAD1),
    _two_gpu_row("Megatron-core 0.16.1 pp=2, local spec", "megatron_pp", ZB1_AHEAD1),
    _two_gpu_row("engine tp=2", "engine_tp2", None),
    _two_gpu_row("DTensor TP (torchtitan's plan), eager", "dtensor_tp", "engine_tp2"),
    _two_gpu_row("Megatron-core tp=2", "megatron_tp", "engine_tp2"),
    _two_gpu_row("engine tp=2 `--sequence-parallel` (per-slab collectives: see below)", "engine_tp2_sp", None),
    _two_gpu_row("DTensor TP + SequenceParallel", "dtensor_tp_sp", "engine_tp2_sp"),
    _two_gpu_row("Megatron-core tp=2 + sequence parallel", "megatron_tp_sp", "engine_tp2_sp"),
    # docs/performance.md: the Llama table's goal column and its four-GPU row
    (PERF, "| {}× | ≥ 1.1×: {} |", lambda: fixed(3)(_target(LLAMA1, ">= 1.1x plain PyTorch compiled")["value"]),
     lambda: _verdict(LLAMA1, ">= 1.1x plain PyTorch compiled")),
    (PERF, "| {}× | ≥ 2×: {} |", lambda: fixed(2)(_target(LLAMA1, ">= 2x Megatron-core (local spec)")["value"]),
     lambda: _verdict(LLAMA1, ">= 2x Megatron-core (local spec)")),
    (PERF, "| pp2 × tp2 on 4 GPUs, 1f1b, vs Megatron-core pp2 × tp2 | {} ({}%) | {} ({}%) | {}× | ≥ 2×: {} |",
     lambda: comma(_llama4("llama_pp2tp2")["per_s"]), lambda: pct()(_llama4("llama_pp2tp2")["mfu"]),
     lambda: comma(_llama4("megatron_pp2tp2")["per_s"]), lambda: pct()(_llama4("megatron_pp2tp2")["mfu"]),
     lambda: fixed(3)(_llama4("llama_pp2tp2")["per_s"] / _llama4("megatron_pp2tp2")["per_s"]),
     lambda: "missed" if _llama4("llama_pp2tp2")["per_s"] < 2 * _llama4("megatron_pp2tp2")["per_s"] else "met"),
    (PERF, "| one GPU, 8 micro-batches (the peers' setting), vs plain PyTorch compiled | {} ({}%) | {} ({}%) | {}× |",
     lambda: comma(llama("llama_1gpu")), lambda: pct()(_llama1("llama_1gpu")["mfu"]),
     lambda: comma(llama("torch_compile_1gpu")), lambda: pct()(_llama1("torch_compile_1gpu")["mfu"]),
     lambda: ratio(llama("llama_1gpu"), llama("torch_compile_1gpu"), 3)),
    (PERF, "| one GPU, 8 micro-batches, vs Megatron-core 0.16.1 local spec | {} | {} ({}%) | {}× |",
     lambda: comma(llama("llama_1gpu")), lambda: comma(llama("megatron_1gpu")),
     lambda: pct()(_llama1("megatron_1gpu")["mfu"]), lambda: ratio(llama("llama_1gpu"), llama("megatron_1gpu"))),
    # docs/llama.md: the CPU comparison's sentence, the GPU tables' rows and what the page reads from them
    (LLAMA_DOC, "the Python 3.11 documentation's sources ({} MB,",
     lambda: fixed(0)(int(results(LLAMA_TEXT)["data"].split(", ")[1].split()[0]) / 1e6)),
    (LLAMA_DOC, "The Llama ends {}% below the GPT ({} nats), at {}× its CPU throughput ({} against {} tokens/s).",
     lambda: pct()(-results(LLAMA_TEXT)["target"]["llama_rel_to_gpt"]),
     lambda: fixed(2)(_text_run("gpt")["final_val_loss"] - _text_run("llama")["final_val_loss"]),
     lambda: ratio(_text_run("llama")["tokens_s"], _text_run("gpt")["tokens_s"]),
     lambda: comma(_text_run("llama")["tokens_s"]), lambda: comma(_text_run("gpt")["tokens_s"])),
    *[_llama_row(label, LLAMA1, run, bold=run == "llama_1gpu_m4") for label, run in (
        ("engine, 1f1b, 8 micro-batches", "llama_1gpu"), ("engine, 4 micro-batches", "llama_1gpu_m4"),
        ("engine, `--compile`", "llama_1gpu_compile"), ("engine, `--recompute selective`", "llama_1gpu_selective"),
        ("plain PyTorch, compiled (8 micro-batches)", "torch_compile_1gpu"), ("plain PyTorch, eager", "torch_1gpu"),
        ("Megatron-core 0.16.1, local spec", "megatron_1gpu"))],
    *[_llama_row(label, LLAMA4, run, bold=run == "llama_pp2tp2") for label, run in (
        ("engine, 1f1b", "llama_pp2tp2"), ("engine, zb1 + merged W", "llama_pp2tp2_zb1"),
        ("engine, `--sequence-parallel`", "llama_pp2tp2_sp"), ("engine, `--compile`", "llama_pp2tp2_compile"),
        ("Megatron-core 0.16.1 pp2 × tp2, local spec", "megatron_pp2tp2"))],
    (LLAMA_DOC, "- ≥ 2× Megatron-core: **{}**, {}×.",
     lambda: "met" if results(LLAMA1)["targets"][">= 2x Megatron-core (local spec)"]["met"] else "missed",
     lambda: fixed(2)(results(LLAMA1)["targets"][">= 2x Megatron-core (local spec)"]["value"])),
    (LLAMA_DOC, "- ≥ 1.1× plain PyTorch compiled: **{}**, {}× (the engine at 4 micro-batches against the peer at 8; at "
     "the same 8 micro-batches {}×).",
     lambda: "met" if results(LLAMA1)["targets"][">= 1.1x plain PyTorch compiled"]["met"] else "missed",
     lambda: fixed(3)(results(LLAMA1)["targets"][">= 1.1x plain PyTorch compiled"]["value"]),
     lambda: ratio(llama("llama_1gpu"), llama("torch_compile_1gpu"), 3)),
    (LLAMA_DOC, "it holds {} GiB less ({} against {}).",
     lambda: fixed(1)(_llama1("llama_1gpu")["peak_gib"][0] - _llama1("torch_compile_1gpu")["peak_gib"][0]),
     lambda: fixed(1)(_llama1("torch_compile_1gpu")["peak_gib"][0]),
     lambda: fixed(1)(_llama1("llama_1gpu")["peak_gib"][0])),
    (LLAMA_DOC, "the GEMMs were {}% of the GPU's time and the GPU idled ~{}% of the step",
     lambda: f"{sum(profile_cuda_percent(PROFILE, 'profile_gpt.txt', n) for n in ('aten::mm', 'aten::addmm')):.0f}",
     lambda: pct(0)(gpu_idle_fraction(PROFILE, "profile_gpt.txt"))),
    (LLAMA_DOC, "- `--compile` is slower ({} against {} ms a step)",
     lambda: fixed(0)(_llama1("llama_1gpu_compile")["step_ms"]), lambda: fixed(0)(_llama1("llama_1gpu")["step_ms"])),
    (LLAMA_DOC, "- ≥ 2× Megatron-core on the same grid: **{}**, {}×. The miss ({}%) is inside the run's own "
     "spread: its five timed steps took {}–{} ms (median {}; Megatron's median {})",
     lambda: _verdict(LLAMA4, LLAMA4_GOAL), lambda: fixed(3)(_target(LLAMA4, LLAMA4_GOAL)["value"]),
     lambda: pct()(1 - _llama4("llama_pp2tp2")["per_s"] / (2 * _llama4("megatron_pp2tp2")["per_s"])),
     lambda: fixed(0)(min(_llama4_timed_ms())), lambda: fixed(0)(max(_llama4_timed_ms())),
     lambda: fixed(1)(_llama4("llama_pp2tp2")["step_ms"]), lambda: fixed(1)(_llama4("megatron_pp2tp2")["step_ms"])),
    (LLAMA_DOC, "- {}% MFU on four cards against {}–{}% on one: {}× the one-GPU run's tokens/s",
     lambda: pct(0)(_llama4("llama_pp2tp2")["mfu"]), lambda: pct(0)(_llama1("llama_1gpu")["mfu"]),
     lambda: pct(0)(_llama1("llama_1gpu_m4")["mfu"]),
     lambda: ratio(_llama4("llama_pp2tp2")["per_s"], llama("llama_1gpu"))),
    (LLAMA_DOC, "Sequence parallelism costs {}% here ({} against {})",
     lambda: pct(0)(1 - _llama4("llama_pp2tp2_sp")["per_s"] / _llama4("llama_pp2tp2")["per_s"]),
     lambda: comma(_llama4("llama_pp2tp2_sp")["per_s"]), lambda: comma(_llama4("llama_pp2tp2")["per_s"])),
    # docs/gpt.md: the real-text curves' early agreement
    ("docs/gpt.md", "The curves agree to {}% up to step 49;", lambda: pct()(max(
        abs(b[1] / a[1] - 1) for a, b in zip(*(results("2026-11-26-1xH100-gpt-realtext.json")["runs"][p]["val_loss"]
                                             for p in ("fp32", "bf16"))) if a[0] <= 49))),
    # docs/llama.md: the CPU comparison's validation curves (the Llama's last point in bold)
    *[(LLAMA_DOC, f"| {name} | {{}} | {{}} | {{}} | {{}} | {{}} | {bold}{{}}{bold} |",
       *[lambda i=i, k=k: fixed(3)(results(LLAMA_TEXT)["target"]["val_loss_llama_gpt"][k][i]) for k in range(6)])
      for name, i, bold in (("Llama", 1, "**"), ("GPT", 2, ""))],
    ("docs/gpt.md", "the 0.9M-parameter model above took a median {} ms a step",
     lambda: rounded(first_median_step_ms(), 0)),
    (PERF, "Every engine and torch peer run's losses are within {} (relative) of the one-GPU engine run's",
     lambda: _loss_tolerance()),
    (LLAMA_DOC, "`bash experiments/passes/llama_text_cpu.sh` (~{} min on 2 cores;",
     lambda: rounded(max(r["wall_s"] for r in results(LLAMA_TEXT)["runs"].values()) / 60, 0)),
    (PERF, "1F1B: {}), the losses agreeing to {}", lambda: comma(summary_rate(JOB9, "engine_dp2pp2_1f1b.log")),
     _job9_loss_agreement),
    # README.md: its short commands' times (each run once as written on 2 shared cores)
    ("README.md", "lists every flag with its default (about {} s);", lambda: _command_s("help")),
    ("README.md", "as bytes (vocabulary 256): ~{} s", lambda: _command_s("prepare")),
    ("README.md", "in one process: ~{} s", lambda: _command_s("sample")),
    ("README.md", "prints one and its simulated bubble (~{} s).", lambda: _command_s("schedule")),
    ("README.md", "saying why the others lose (~{} s).", lambda: _command_s("plan")),
    ("README.md", "(1, 2, 4 or 8 ranks; about {} s on 4 ranks on 2 cores)", lambda: _command_s("api4")),
    ("README.md", "(examples/data/code.txt.gz, {} MB:",
     lambda: fixed(2)(results(FIRST)["text"]["bytes"] / 1e6)),
    ("docs/gpt.md", "(the first-ten-minutes size: ~{} s a step on 2 cores)",
     lambda: rounded(first_median_step_ms() / 1e3, 1)),
    ("docs/checkpoints.md", "--tokens 300 # ~{} s for a small GPT", lambda: _command_s("sample")),
    # docs/gpt.md's and docs/llama.md's CPU commands' times (each run once as written on 2 shared cores)
    ("docs/gpt.md", "--dp 2 --pp 2 --mp 2 # ~{} s", lambda: _docs_command_s("gpt_cpu_8ranks")),
    (LLAMA_DOC, "on the built-in corpus, 10 steps: ~{} s", lambda: _docs_command_s("llama_cpu_4ranks")),
    (LLAMA_DOC, "# stand-in's tokenizer): ~{} s", lambda: _docs_command_s("hf_text", "hf_text_bpe")),
    (LLAMA_DOC, "(config.json, model.safetensors, tokenizer.json): ~{} s", lambda: _docs_command_s("hf_stand_in")),
    (LLAMA_DOC, "its tokenizer tokenizes the text (~{} s), the import writes a # checkpoint and its model.toml (~{} s)",
     lambda: _docs_command_s("hf_tokenize"), lambda: _docs_command_s("hf_import")),
    (LLAMA_DOC, "with the LLM recipe: ~{} s", lambda: _docs_command_s("hf_fine_tune")),
    (LLAMA_DOC, "decoded with the model directory's tokenizer: ~{} s", lambda: _docs_command_s("hf_sample")),
    (LLAMA_DOC, "copies its tokenizer files: ~{} s", lambda: _docs_command_s("hf_export")),
    (LLAMA_DOC, "generates with it (greedy): ~{} s", lambda: _docs_command_s("hf_transformers_generate")),
] + STEP_CLAIMS
