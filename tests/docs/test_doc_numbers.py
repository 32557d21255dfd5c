"""The numbers README.md and docs/ show are their results files' numbers: a table of claims (the page, the text as
it is shown with a {} for each number, and for each number where it comes from, formatted to the digits shown), so
a stale or mistyped number fails here. docs/llama.md's tables are held by test_llama_doc.py, the same way.

A result is read from `experiments/results/` (a results JSON: a run's field or a ratio the file records; a ratio
the page computes is computed here from the two runs), or from a job's log archive under `raw/` (a run's
`summary:` line, a profile's table) where the page names that archive."""
from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
import sys

import pytest

from claims_text import CLAIMS as TEXT_CLAIMS
from claims_step_text import SPLIT
from doc_sources import (FIRST, GPT1, GPT_DP, GRIDS_MLP, JOB9, LLAMA1, LLAMA1_GRAPHED, LLAMA4, PERF, PLAN1, PLAN4,
                         PLANNING, PPTP, PROFILE, REPO, ZERO_OVERLAP, ZERO_SCALING, comma, first_loss, fixed,
                         gpt1_ratio, grid_gpt, grid_mlp, json_line_field, llama, max_batch, mlp, mlp_ratios, mlp_run, page, pct, peak_errors,
                         pptp, profile_calls, profile_cuda_percent, profile_host_us_per_call, ratio, results,
                         summary_ms, summary_rate, zero_head, zero_scaling, long_seq4)

REALTEXT = "2026-11-26-1xH100-gpt-realtext{}.json"
LONG_SEQ = "2026-11-27-2xH200-long-seq.json"
ZERO_DP2 = "2026-11-27-2xH200-zero-sharding-dp2.json"
SP_COLLECTIVES = ("c10d::reduce_scatter_", "c10d::allgather_")  # the host-side ops of the sequence-parallel collectives
def step_errors(prefix: str, four: bool) -> list[float]:
    """The plan pass's (measured - predicted) / predicted step times of a model's runs."""
    return [r["step_error"] for name, r in results(PLAN4 if four else PLAN1)["runs"].items() if name.startswith(prefix)]


GPT1_H100, CONVERGENCE = "2026-11-26-1xH100-gpt.json", "2026-11-26-2xH200-convergence.json"


def gpt_one_gpu(system: str) -> list:
    """A row of the one-GPU GPT table: tokens/s, MFU and the engine over it, on the H200 and on the H100."""
    def cells(name: str) -> list:
        data = results(name)
        engine = data["engine"]["gpt_bf16_1f1b"]
        run = engine if system == "engine" else data["peers"][system]
        out = [lambda: comma(run["tokens_s"]), lambda: pct()(run["mfu"])]
        return out if system == "engine" else out + [lambda: ratio(engine["tokens_s"], run["tokens_s"])]
    return cells(GPT1) + cells(GPT1_H100)


def zero_dp2(run: str) -> dict:
    return results(ZERO_DP2)["micro_batches_8"][run]


def long_seq(name: str) -> dict:
    return next(r for r in results(LONG_SEQ)["runs"] if r["name"] == name)


def realtext(job: str, precision: str) -> float:
    return results(REALTEXT.format(job))["runs"][precision]["val_loss"][-1][1]


# (page, the text as shown with {} for each number, a callable giving each number as shown)
CLAIMS = [
    # README.md, the headline table
    ("README.md", "1F1B {} samples/s; tuned (zb1 + merged W + lookahead 1) {} | torch.distributed.pipelining 1F1B {}; "
     "the course's base code {} | 1F1B {}×, {}×; tuned {}×, {}× |",
     lambda: comma(mlp("engine", "L", "1f1b")), lambda: comma(mlp("engine", "L", "zb1")),
     lambda: comma(mlp("peer", "L", "1f1b")), lambda: comma(mlp("base", "L", "practical10")),
     lambda: ratio(mlp("engine", "L", "1f1b"), mlp("peer", "L", "1f1b")),
     lambda: ratio(mlp("engine", "L", "1f1b"), mlp("base", "L", "practical10")),
     lambda: ratio(mlp("engine", "L", "zb1"), mlp("peer", "L", "1f1b")),
     lambda: ratio(mlp("engine", "L", "zb1"), mlp("base", "L", "practical10"))),
    ("README.md", "| 1 × H200 | {} tokens/s ({}% MFU) | torch.compile {}; Megatron-core {} | {}×; {}× |",
     lambda: comma(results(GPT1)["engine"]["gpt_bf16_1f1b"]["tokens_s"]),
     lambda: pct()(results(GPT1)["engine"]["gpt_bf16_1f1b"]["mfu"]),
     lambda: comma(results(GPT1)["peers"]["torch-compile"]["tokens_s"]),
     lambda: comma(results(GPT1)["peers"]["megatron"]["tokens_s"]),
     lambda: gpt1_ratio("torch-compile"),
     lambda: gpt1_ratio("megatron")),
    ("README.md", "| 2 × H100 | 1F1B {} tokens/s; tuned (zb1 + merged W + lookahead 1) {} ({}% MFU) | torch "
     "pipelining 1F1B, compiled {}; Megatron-core {} | 1F1B {}×, {}×; tuned {}×, {}× |",
     lambda: comma(pptp("engine_pp2_1f1b")), lambda: comma(pptp("engine_pp2_zb1m_ahead1")),
     lambda: pct()(results(PPTP)["runs"]["engine_pp2_zb1m_ahead1"]["mfu"]),
     lambda: comma(pptp("torch_pp_compile")), lambda: comma(pptp("megatron_pp")),
     lambda: ratio(pptp("engine_pp2_1f1b"), pptp("torch_pp_compile")),
     lambda: ratio(pptp("engine_pp2_1f1b"), pptp("megatron_pp")),
     lambda: ratio(pptp("engine_pp2_zb1m_ahead1"), pptp("torch_pp_compile")),
     lambda: ratio(pptp("engine_pp2_zb1m_ahead1"), pptp("megatron_pp"))),
    ("README.md", "| 2 × H100 | {} tokens/s | DTensor TP {}; Megatron-core {} | {}×; {}× |",
     lambda: comma(pptp("engine_tp2")), lambda: comma(pptp("dtensor_tp")), lambda: comma(pptp("megatron_tp")),
     lambda: ratio(pptp("engine_tp2"), pptp("dtensor_tp")), lambda: ratio(pptp("engine_tp2"), pptp("megatron_tp"))),
    ("README.md", "| 4 × H200 | {} tokens/s ({}% MFU) | torch pipelining ZBV {} | {}× |",
     lambda: comma(results(SPLIT)["runs"]["engine_pp4_zbv"]["tokens_s"]),
     lambda: pct()(results(SPLIT)["runs"]["engine_pp4_zbv"]["mfu"]),
     lambda: comma(results(SPLIT)["runs"]["torch_pp4_zbv"]["tokens_s"]),
     lambda: fixed(2)(results(SPLIT)["engine_best_vs_torch_best"]["value"])),
    ("README.md", "| 4 × H200 | mp2 {} ms, mp4 {} ms a step | one GPU {} ms | {}×; {}× |",
     lambda: fixed(2)(results(GRIDS_MLP)["runs"]["L_mp2"]["step_ms"]),
     lambda: fixed(2)(results(GRIDS_MLP)["runs"]["L_mp4"]["step_ms"]),
     lambda: fixed(2)(results(GRIDS_MLP)["runs"]["L_1gpu_m1"]["step_ms"]),
     lambda: ratio(results(GRIDS_MLP)["runs"]["L_mp2"]["per_s"], results(GRIDS_MLP)["runs"]["L_1gpu_m1"]["per_s"]),
     lambda: ratio(results(GRIDS_MLP)["runs"]["L_mp4"]["per_s"], results(GRIDS_MLP)["runs"]["L_1gpu_m1"]["per_s"])),
    ("README.md", "| 1 × H200 | {} tokens/s ({}% MFU; CUDA graphs, auto) | plain PyTorch compiled {}; Hugging Face "
     "transformers compiled {} | {}×; {}× |",
     lambda: comma(llama("llama_1gpu", LLAMA1_GRAPHED)),
     lambda: pct()(results(LLAMA1_GRAPHED)["runs"]["llama_1gpu"]["mfu"]),
     lambda: comma(llama("torch_compile_1gpu", LLAMA1_GRAPHED)),
     lambda: comma(llama("hf_compile_1gpu", LLAMA1_GRAPHED)),
     lambda: ratio(llama("llama_1gpu", LLAMA1_GRAPHED), llama("torch_compile_1gpu", LLAMA1_GRAPHED)),
     lambda: ratio(llama("llama_1gpu", LLAMA1_GRAPHED), llama("hf_compile_1gpu", LLAMA1_GRAPHED))),
    ("README.md", "| 4 × H200 | {} tokens/s | Megatron-core pp2 × tp2 {} | {}× |",
     lambda: comma(results(LLAMA4)["runs"]["llama_pp2tp2"]["per_s"]),
     lambda: comma(results(LLAMA4)["runs"]["megatron_pp2tp2"]["per_s"]),
     lambda: fixed(2)(results(LLAMA4)["runs"]["llama_pp2tp2"]["per_s"]
                      / results(LLAMA4)["runs"]["megatron_pp2tp2"]["per_s"])),
    ("README.md", "| auto's step time | the best of a hand-tuned sweep | {}–{} |",
     lambda: fixed(2)(min(r["auto_over_best"] for f in (PLAN1, PLAN4) for r in results(f)["auto_vs_best"].values())),
     lambda: fixed(2)(max(r["auto_over_best"] for f in (PLAN1, PLAN4) for r in results(f)["auto_vs_best"].values()))),
    ("README.md", "| 2 × H200 | 1F1B {} rows; GPipe {} | 1F1B {}; GPipe {} | 1F1B {}×; GPipe {}× |",
     lambda: comma(max_batch("1f1b", "fp16-recompute")), lambda: comma(max_batch("gpipe", "fp16-recompute")),
     lambda: comma(max_batch("1f1b", "fp32")), lambda: comma(max_batch("gpipe", "fp32")),
     lambda: ratio(max_batch("1f1b", "fp16-recompute"), max_batch("1f1b", "fp32")),
     lambda: ratio(max_batch("gpipe", "fp16-recompute"), max_batch("gpipe", "fp32"))),
    ("README.md", "| 4 × H200 | {} tokens/s ({}% MFU), {} GiB per GPU; at 32k {} | at 32k: torch context_parallel {} | "
     "at 32k: {}× |",
     lambda: comma(long_seq4("cp4_128k")["tokens_s"]), lambda: pct()(long_seq4("cp4_128k")["mfu"]),
     lambda: fixed(1)(max(long_seq4("cp4_128k")["peak_gib_per_gpu"])), lambda: comma(long_seq4("cp4_32k")["tokens_s"]),
     lambda: comma(long_seq4("torch_cp4_32k")["tokens_s"]),
     lambda: ratio(long_seq4("cp4_32k")["tokens_s"], long_seq4("torch_cp4_32k")["tokens_s"])),
    ("README.md", "| 4 × H200 | {} tokens/s ({}% MFU), {} GiB | compiled: FSDP2 (HF's Llama) {}; torchtitan {} | "
     "{}×; {}× |",
     lambda: comma(zero_head("plan_auto")["tokens_s"]), lambda: pct()(zero_head("plan_auto")["mfu"]),
     lambda: fixed(1)(zero_head("plan_auto")["peak_gib"]), lambda: comma(zero_head("fsdp2_compile")["tokens_s"]),
     lambda: comma(zero_head("torchtitan_compile")["tokens_s"]),
     lambda: ratio(zero_head("plan_auto")["tokens_s"], zero_head("fsdp2_compile")["tokens_s"]),
     lambda: ratio(zero_head("plan_auto")["tokens_s"], zero_head("torchtitan_compile")["tokens_s"])),
    ("README.md", "| 2 × H200 | {}% strong, {}% weak | config L: {}% strong, {}% weak |",
     lambda: pct()(results(GPT_DP)["ratios"]["strong_efficiency"]),
     lambda: pct()(results(GPT_DP)["ratios"]["weak_efficiency"]),
     lambda: pct(0)(mlp_ratios()["L_dp2_fp16_scaling_efficiency"]),
     lambda: pct(0)(mlp_ratios()["L_dp2_fp16_weak_scaling_efficiency"])),
    # README.md, the first ten minutes: the losses and the sample of the run on the fixed text
    ("README.md", "step 199: validation loss {} step 399: validation loss {} step 599: validation loss {} step 799: "
     "validation loss {}", lambda: first_loss(0), lambda: first_loss(1), lambda: first_loss(2), lambda: first_loss(3)),
    ("README.md", "``` {} ```", lambda: " ".join("\n".join(results(FIRST)["sample"].splitlines()[:4]).split())),
    # docs/performance.md
    (PERF, "FSDP2 on Hugging Face's Llama trains it at {} tokens/s ({}% MFU, {} GiB per GPU; compiled {}), while",
     lambda: comma(zero_dp2("fsdp2_eager")["tokens_s"]), lambda: pct()(zero_dp2("fsdp2_eager")["mfu"]),
     lambda: fixed(1)(zero_dp2("fsdp2_eager")["peak_gib"]), lambda: comma(zero_dp2("fsdp2_compile")["tokens_s"])),
    (PERF, "| L pp=2 fp16 | {} samples/s | {} | {} (1F1B: {}) | {}× (1F1B: {}×) | {}× (1F1B: {}×) "
     "|",
     lambda: comma(mlp("base", "L", "practical10")), lambda: comma(mlp("peer", "L", "1f1b")),
     lambda: comma(mlp("engine", "L", "zb1")), lambda: comma(mlp("engine", "L", "1f1b")),
     lambda: ratio(mlp("engine", "L", "zb1"), mlp("peer", "L", "1f1b")),
     lambda: ratio(mlp("engine", "L", "1f1b"), mlp("peer", "L", "1f1b")),
     lambda: ratio(mlp("engine", "L", "zb1"), mlp("base", "L", "practical10")),
     lambda: ratio(mlp("engine", "L", "1f1b"), mlp("base", "L", "practical10"))),
    (PERF, "| L pp=2 fp32 | {} | {} | {} | {}× | {}× |",
     lambda: comma(mlp("base", "L", "practical10", "fp32")),
     lambda: comma(mlp("peer", "L", "1f1b", "fp32")),
     lambda: comma(mlp("engine", "L", "zb1", "fp32")),
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp32_vs_peer_1f1b"]),
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp32_vs_base"])),
    (PERF, "| C pp=2 fp16 | {} | {} | {} | {}× | {}× |",
     lambda: comma(mlp("base", "C", "practical10")), lambda: comma(mlp("peer", "C", "1f1b")),
     lambda: comma(mlp("engine", "C", "zb1")),
     lambda: ratio(mlp("engine", "C", "zb1"), mlp("peer", "C", "1f1b")),
     lambda: ratio(mlp("engine", "C", "zb1"), mlp("base", "C", "practical10"))),
    (PERF, "| X pp=2 fp16 | — | {} | {} ({} TFLOP/s per GPU) | {}× | — |",
     lambda: comma(mlp("peer", "X", "1f1b")), lambda: comma(mlp("engine", "X", "zb1")),
     lambda: f"{mlp_run('engine', 'X', 'zb1')['tflops_per_gpu']:.0f}",
     lambda: ratio(mlp("engine", "X", "zb1"), mlp("peer", "X", "1f1b"))),
    (PERF, "The traced 1F1B bubble at config L is {}× (fp32) and {}× (fp16) the unit-cost "
     "simulation",
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp32_1f1b_bubble_traced_over_simulated"]),
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp16_1f1b_bubble_traced_over_simulated"])),
    (PERF, "measured from step times against one GPU instead, the fp16 bubble is {}× the simulation",
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp16_1f1b_bubble_measured_over_simulated"])),
    (PERF, "(traced over calibrated {}× and {}×)",
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp32_1f1b_bubble_traced_over_calibrated"]),
     lambda: fixed(2)(mlp_ratios()["L_pp2_fp16_1f1b_bubble_traced_over_calibrated"])),
    (PERF, "| 1F1B, 8 micro-batches | {} | {} ({}×) | {} ({}×) |",
     lambda: comma(max_batch("1f1b", "fp32")), lambda: comma(max_batch("1f1b", "fp16")),
     lambda: ratio(max_batch("1f1b", "fp16"), max_batch("1f1b", "fp32")),
     lambda: comma(max_batch("1f1b", "fp16-recompute")),
     lambda: ratio(max_batch("1f1b", "fp16-recompute"), max_batch("1f1b", "fp32"))),
    (PERF, "| GPipe, 16 micro-batches | {} | {} ({}×) | {} (**{}×**) |",
     lambda: comma(max_batch("gpipe", "fp32")), lambda: comma(max_batch("gpipe", "fp16")),
     lambda: ratio(max_batch("gpipe", "fp16"), max_batch("gpipe", "fp32")),
     lambda: comma(max_batch("gpipe", "fp16-recompute")),
     lambda: ratio(max_batch("gpipe", "fp16-recompute"), max_batch("gpipe", "fp32"))),
    (PERF, "(its base code's own setting, 2 processes × 2 GPUs: {} samples/s), the engine ran {} samples/s ({}×; "
     "1F1B: {})",
     lambda: comma(json_line_field(JOB9, "base_dp2.log", "samples_s")),
     lambda: comma(summary_rate(JOB9, "engine_dp2pp2.log")),
     lambda: ratio(summary_rate(JOB9, "engine_dp2pp2.log"), json_line_field(JOB9, "base_dp2.log", "samples_s")),
     lambda: comma(summary_rate(JOB9, "engine_dp2pp2_1f1b.log"))),
    (PERF, "config L's step is {} ms with `--zero 1` against one H100's {} ms in the same job",
     lambda: fixed(2)(summary_ms(ZERO_SCALING, "L_dp2_zero_1f1b.log")),
     lambda: fixed(2)(summary_ms(ZERO_SCALING, "L_dp1_1f1b.log"))),
    (PERF, "took the `--zero 1` step from {} ms (exposed) to {} ms, against {} ms replicated",
     lambda: fixed(2)(summary_ms(ZERO_OVERLAP, "L_dp2_zero_exposed_1f1b.log")),
     lambda: fixed(2)(summary_ms(ZERO_OVERLAP, "L_dp2_zero_1f1b.log")),
     lambda: fixed(2)(summary_ms(ZERO_OVERLAP, "L_dp2_1f1b.log"))),
    (PERF, "GEMMs (aten::mm and aten::addmm) are {}% of the GPU's time",
     lambda: f"{sum(profile_cuda_percent(PROFILE, 'profile_gpt.txt', n) for n in ('aten::mm', 'aten::addmm')):.0f}"),
    (PERF, "≈ {} µs of host time per collective, {} a step: {} in its 3 profiled steps",
     lambda: f"{round(profile_host_us_per_call(ZERO_SCALING, 'profile_tp2_sp.txt', SP_COLLECTIVES), -1):.0f}",
     lambda: comma(sum(profile_calls(ZERO_SCALING, "profile_tp2_sp.txt", n)
                       for n in ("nccl:reduce_scatter", "nccl:all_gather")) / 3),
     lambda: comma(sum(profile_calls(ZERO_SCALING, "profile_tp2_sp.txt", n)
                       for n in ("nccl:reduce_scatter", "nccl:all_gather")))),
    (PERF, "one GPU {} tokens/s ({}% MFU); dp=2 strong {}% ({}% with `--zero 1`), weak {}% ({}%)",
     lambda: comma(results(GPT_DP)["runs"]["gpt_single"]["tokens_s"]),
     lambda: pct()(results(GPT_DP)["runs"]["gpt_single"]["mfu"]),
     *[lambda k=k: pct()(results(GPT_DP)["ratios"][k])
       for k in ("strong_efficiency", "strong_efficiency_zero", "weak_efficiency", "weak_efficiency_zero")]),
    (PERF, "| engine, bf16 half weights, 1f1b | {} ({}%) | — | {} ({}%) | — |",
     *gpt_one_gpu("engine")),
    (PERF, "| torch.compile (bf16 autocast, fused AdamW) | {} ({}%) | {}× | {} ({}%) | {}× |",
     *gpt_one_gpu("torch-compile")),
    (PERF, "| plain PyTorch eager | {} ({}%) | {}× | {} ({}%) | {}× |", *gpt_one_gpu("torch")),
    (PERF, "| Megatron-core 0.16.1, local spec | {} ({}%) | {}× | {} ({}%) | {}× |", *gpt_one_gpu("megatron")),
    (PERF, "fp16 with dynamic loss scaling runs at {}× bf16 on the H200 and {}× on the H100",
     lambda: fixed(3)(results(GPT1)["ratios"]["engine_fp16_over_bf16_zb1m"]),
     lambda: fixed(3)(results(GPT1_H100)["ratios"]["engine_fp16_over_bf16_zb1m"])),
    (PERF, "200 steps of config L end within {} (relative) of the fp32 loss",
     lambda: f"{results(CONVERGENCE)['final_relative_difference']:.1e}".replace("e-05", "e-5")),
    (PERF, "`--zero 1` takes peak memory per rank from {} to {} GiB",
     lambda: str(results(GPT_DP)["runs"]["gpt_dp2"]["peak_gib"][0]),
     lambda: fixed(2)(results(GPT_DP)["runs"]["gpt_dp2_zero"]["peak_gib"][0])),
    *[(PERF, f"| {label} | {{}} ({{}}%) |", lambda run=run: comma(pptp(run)),
       lambda run=run: pct()(results(PPTP)["runs"][run]["mfu"]))
      for label, run in (("torch.distributed.pipelining 1F1B, blocks compiled", "torch_pp_compile"),
                         ("torch.distributed.pipelining 1F1B, eager", "torch_pp"),
                         ("Megatron-core 0.16.1 pp=2, local spec", "megatron_pp"), ("engine tp=2", "engine_tp2"),
                         ("DTensor TP (torchtitan's plan), eager", "dtensor_tp"),
                         ("Megatron-core tp=2", "megatron_tp"))],
    (PERF, "| engine pp=2, zb1 + merged W + lookahead 1 (1f1b: {}) | {} ({}%) | — |",
     lambda: comma(pptp("engine_pp2_1f1b")), lambda: comma(pptp("engine_pp2_zb1m_ahead1")),
     lambda: pct()(results(PPTP)["runs"]["engine_pp2_zb1m_ahead1"]["mfu"])),
    (PERF, "| one GPU, 8 micro-batches (the peers' setting), vs plain PyTorch compiled | {} ({}%) | {} "
     "({}%) "
     "| {}× | — |", lambda: comma(llama("llama_1gpu")), lambda: pct()(results(LLAMA1)["runs"]["llama_1gpu"]["mfu"]),
     lambda: comma(llama("torch_compile_1gpu")), lambda: pct()(results(LLAMA1)["runs"]["torch_compile_1gpu"]["mfu"]),
     lambda: ratio(llama("llama_1gpu"), llama("torch_compile_1gpu"), 3)),
    (PERF, "| one GPU, 8 micro-batches, vs Megatron-core 0.16.1 local spec | {} | {} ({}%) | {}× "
     "| — |",
     lambda: comma(llama("llama_1gpu")), lambda: comma(llama("megatron_1gpu")),
     lambda: pct()(results(LLAMA1)["runs"]["megatron_1gpu"]["mfu"]),
     lambda: ratio(llama("llama_1gpu"), llama("megatron_1gpu"))),
    (PERF, "| one GPU, 4 micro-batches (tuned), vs plain PyTorch compiled at 8 | {} ({}%) | {} | "
     "{}× |",
     lambda: comma(llama("llama_1gpu_m4")), lambda: pct()(results(LLAMA1)["runs"]["llama_1gpu_m4"]["mfu"]),
     lambda: comma(llama("torch_compile_1gpu")),
     lambda: fixed(3)(results(LLAMA1)["targets"][">= 1.1x plain PyTorch compiled"]["value"])),
    (PERF, "| one GPU, 4 micro-batches (tuned), vs Megatron-core at 8 | {} | {} | {}× |",
     lambda: comma(llama("llama_1gpu_m4")), lambda: comma(llama("megatron_1gpu")),
     lambda: fixed(2)(results(LLAMA1)["targets"][">= 2x Megatron-core (local spec)"]["value"])),
    (PERF, "| L mp=2 fp16 | — | DTensor TP {} | {} | {}× | — |", lambda: comma(mlp("peer", "L", "tp")),
     lambda: comma(mlp("engine", "L", "tp")), lambda: ratio(mlp("engine", "L", "tp"), mlp("peer", "L", "tp"))),
    (PERF, "| L mp=2 bf16 | — | DTensor TP {} | {} | {}× | — |", lambda: comma(mlp("peer", "L", "tp", "bf16")),
     lambda: comma(mlp("engine", "L", "tp", "bf16")),
     lambda: ratio(mlp("engine", "L", "tp", "bf16"), mlp("peer", "L", "tp", "bf16"))),
    (PERF, "| 1f1b, replicated (2 × H200, `experiments/passes/dp_pass.sh`) | {}% | {}% |",
     lambda: pct(0)(mlp_ratios()["L_dp2_fp16_scaling_efficiency"]),
     lambda: pct(0)(mlp_ratios()["L_dp2_fp16_weak_scaling_efficiency"])),
    (PERF, "`zero_scaling_pass.sh`) | {}% | {}% | | zb1 + merged W, `--zero 1` (2 × H100) | {}% | {}% |",
     lambda: pct(0)(zero_scaling("1f1b", strong=True)), lambda: pct(1)(zero_scaling("1f1b", strong=False)),
     lambda: pct(0)(zero_scaling("zb1m", strong=True)), lambda: pct(1)(zero_scaling("zb1m", strong=False))),
    (PERF, "| mp2 (2 GPUs) | **{}×** | {}× | — | — |", lambda: grid_mlp("L_mp2"), lambda: grid_mlp("C_mp2")),
    (PERF, "| mp4 | **{}×** | {}× | {}× ({}× at 2 micro-batches) | Megatron-core {}×, DTensor TP {}× |",
     lambda: grid_mlp("L_mp4"), lambda: grid_mlp("C_mp4"), lambda: grid_gpt("gpt_tp4"), lambda: grid_gpt("gpt_tp4_m2"),
     lambda: grid_gpt("gpt_tp4", "megatron_tp4"), lambda: grid_gpt("gpt_tp4", "dtensor_tp4")),
    (PERF, "| pp4 | {}× | {}× | {}× (interleaved {}×) | Megatron-core {}×, torch pipelining compiled {}× |",
     lambda: grid_mlp("L_pp4"), lambda: grid_mlp("C_pp4"), lambda: grid_gpt("gpt_pp4"),
     lambda: grid_gpt("gpt_pp4_interleaved"), lambda: grid_gpt("gpt_pp4", "megatron_pp4"),
     lambda: grid_gpt("gpt_pp4", "torch_pp4_compile")),
    (PERF, "| dp2 × pp2 | {}× | {}× | **{}×** | — |", lambda: grid_mlp("L_dp2pp2"), lambda: grid_mlp("C_dp2pp2"),
     lambda: grid_gpt("gpt_dp2pp2")),
    (PERF, "| pp2 × mp2 | {}× | {}× | {}× | Megatron-core {}× |", lambda: grid_mlp("L_pp2mp2"),
     lambda: grid_mlp("C_pp2mp2"), lambda: grid_gpt("gpt_pp2tp2"), lambda: grid_gpt("gpt_pp2tp2", "megatron_pp2tp2")),
    (PERF, "| dp2 × mp2 | {}× | {}× | {}× | — |", lambda: grid_mlp("L_dp2mp2"), lambda: grid_mlp("C_dp2mp2"),
     lambda: grid_gpt("gpt_dp2tp2")),
    (PERF, "| dp4 (`--zero 1`) | {}× | {}× | {}× | — |", lambda: grid_mlp("L_dp4"), lambda: grid_mlp("C_dp4"),
     lambda: grid_gpt("gpt_dp4")),
    # docs/gpt.md, mixed precision on real text
    ("docs/gpt.md", "| fp32 | {} | — | | bf16, half weights | {} | +{}% | | bf16, `--amp-impl autocast` (its own "
     "job's fp32: {}) | {} | +{}% |",
     lambda: fixed(3)(realtext("", "fp32")), lambda: fixed(3)(realtext("", "bf16")),
     lambda: pct()(results(REALTEXT.format(""))["target"]["final_rel_diff"]),
     lambda: fixed(3)(realtext("-autocast", "fp32")), lambda: fixed(3)(realtext("-autocast", "bf16")),
     lambda: pct(2)(results(REALTEXT.format("-autocast"))["target"]["final_rel_diff"])),
    ("docs/gpt.md", "the gap is small either way ({}% with half weights, {}% with the fp32 stream)",
     lambda: pct(2)(results("cpu/2026-11-26-cpu-gpt-realtext-half-weights.json")["target"]["final_rel_diff"]),
     lambda: pct(2)(results("cpu/2026-11-26-cpu-gpt-realtext-fp32-residual.json")["target"]["final_rel_diff"])),
    # docs/planning.md
    (PLANNING, "| MLP L (dim 8192, depth 16, batch 1024, fp16) | 1f1b, 1 micro-batch, {} ms | {} | zb1 + "
     "merged W + lookahead 1, 4 micro-batches, {} ms | {} |",
     lambda: fixed(1)(1e3 * results(PLAN1)["auto_vs_best"]["L"]["auto_step_s"]),
     lambda: fixed(2)(results(PLAN1)["auto_vs_best"]["L"]["auto_over_best"]),
     lambda: fixed(2)(1e3 * results(PLAN4)["auto_vs_best"]["L_pp4"]["auto_step_s"]),
     lambda: fixed(2)(results(PLAN4)["auto_vs_best"]["L_pp4"]["auto_over_best"])),
    (PLANNING, "| MLP C (dim 8192, depth 8, batch 64, fp16) | 1f1b, 1 micro-batch, {} ms | {} | zb1, 1 "
     "micro-batch, {} ms | {} |",
     lambda: fixed(2)(1e3 * results(PLAN1)["auto_vs_best"]["C"]["auto_step_s"]),
     lambda: fixed(2)(results(PLAN1)["auto_vs_best"]["C"]["auto_over_best"]),
     lambda: fixed(2)(1e3 * results(PLAN4)["auto_vs_best"]["C_pp4"]["auto_step_s"]),
     lambda: fixed(2)(results(PLAN4)["auto_vs_best"]["C_pp4"]["auto_over_best"])),
    (PLANNING, "| GPT-1B shape (16 sequences, bf16) | 1f1b, 1 micro-batch, {} ms | {} | interleaved v4, 4 "
     "micro-batches, {} ms | {} |",
     lambda: f"{1e3 * results(PLAN1)['auto_vs_best']['G']['auto_step_s']:.0f}",
     lambda: fixed(2)(results(PLAN1)["auto_vs_best"]["G"]["auto_over_best"]),
     lambda: f"{1e3 * results(PLAN4)['auto_vs_best']['G_pp4']['auto_step_s']:.0f}",
     lambda: fixed(2)(results(PLAN4)["auto_vs_best"]["G_pp4"]["auto_over_best"])),
    (PLANNING, "Predicted peak memory is within {}% for L everywhere and for C on one GPU; C's at pp4 is "
     "{}–{}% under the measured peak; the GPT's is overestimated by {}–{}%",
     lambda: "2" if max(peak_errors("L_", False) + peak_errors("L_", True) + peak_errors("C_", False)) <= 0.02
     else "more than 2",
     lambda: fixed(1)(100 * min(peak_errors("C_", True))), lambda: fixed(1)(100 * max(peak_errors("C_", True))),
     lambda: f"{100 * min(peak_errors('G_', False) + peak_errors('G_', True)):.0f}",
     lambda: f"{100 * max(peak_errors('G_', False) + peak_errors('G_', True)):.0f}"),
    (PLANNING, "The step times the runs predicted were off by up to +{}% on one GPU (C) and +{}% at pp4 (C's many "
     "small P2P messages), and −{}% for the GPT",
     lambda: f"{100 * max(step_errors('C_', False)):.0f}", lambda: f"{100 * max(step_errors('C_', True)):.0f}",
     lambda: f"{-100 * min(step_errors('G_', False) + step_errors('G_', True)):.0f}"),
    (PLANNING, "measured faster than mp4 on 4 × H200: {} against {} ms)",
     lambda: fixed(1)(1e3 * results(PLAN4)["auto_vs_best"]["L_pp4"]["auto_step_s"]),
     lambda: fixed(1)(results(GRIDS_MLP)["runs"]["L_mp4"]["step_ms"])),
    (PLANNING, "measured, dp4 {} ms against pp4's {}.",
     lambda: fixed(1)(1e3 * results(PLAN4)["runs"]["G_dp4_auto"]["step_time_s"]),
     lambda: fixed(1)(1e3 * results(PLAN4)["runs"]["G_pp4_auto"]["step_time_s"])),
]


@pytest.mark.parametrize("claim", CLAIMS + TEXT_CLAIMS, ids=lambda claim: f"{claim[0]}: {claim[1][:60]}")
def test_the_number_shown_is_its_results_files(claim):
    name, shown, *values = claim
    text = shown.format(*(value() for value in values))
    assert text in page(name), f"{name} does not show: {text}"


def test_the_first_ten_minutes_train_on_the_text_their_numbers_were_measured_on():
    """The README's text is a committed file that does not change with the code: the one its losses came from."""
    recorded = results(FIRST)["text"]
    with open(os.path.join(REPO, recorded["file"]), "rb") as f:
        packed = f.read()
    assert hashlib.sha256(packed).hexdigest() == recorded["gz_sha256"]
    assert hashlib.sha256(gzip.decompress(packed)).hexdigest() == recorded["sha256"]
    assert f"gunzip -c {recorded['file']} > runs/code.txt" in page("README.md")
    assert results(FIRST)["commands"][2].split("hybrid_engine.py")[1] in page("README.md").replace(" \\ ", " ")


def test_the_planning_example_is_what_its_command_prints_now():
    """docs/planning.md quotes the plan command's ranking for the MLP L on 4 H200s: its first grid and two of its
    reasons are what the command prints today."""
    command = re.search(r"^    (python -m hybrid_engine\.plan --world-size 4 [^\n]*)$",
                        open(os.path.join(REPO, PLANNING), encoding="utf-8").read(), re.M)[1]
    done = subprocess.run([sys.executable, *command.split()[1:]], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    first = next(line for line in done.stdout.splitlines() if re.match(r"\s*1\s", line))
    assert "1x4x1" in first and "fastest first (for this MLP: pp4 under zbv + merged W" in page(PLANNING)
    for reason in re.findall(r'"((?:pp|dp|mp)\d: [^"]+)"', page(PLANNING)):
        assert reason in done.stdout, (reason, done.stdout)
