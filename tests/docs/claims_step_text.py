"""The numbers docs/ states of the step's speed on GPUs: the fused kernels and fp8 (docs/kernels.md), the
CUDA-graphed stages (docs/performance.md), the V schedules (docs/schedules.md) and the attention blocks' kernels
(docs/long_sequences.md), in claims_text.py's form (the page, the text as shown with {} for each number, a callable
giving each number as shown), read from the results file the sentence names."""
from __future__ import annotations

import json
import os
import tarfile

from doc_sources import PERF, RESULTS, comma, fixed, long_seq4, pct, ratio, results

KERNELS_1B = "2026-11-27-1xH200-kernels-1b.json"
FUSED_AB = "2026-11-27-4xH200-engine-ab-llama-fused-{}.json"
GRAPHS = "2026-11-27-4xH100-graphs.json"
GRAPHS_LLAMA = "2026-11-28-4xH200-graphs-llama.json"
GRAPHS_AUTO = "2026-11-28-4xH200-graphs-llama-auto.json"  # the same grids, graphed where auto chose to
PLAN_UNCAPPED = "2026-11-28-4xH200-zero-sharding-plan-graphed-uncapped.json"  # the 8B's 78 GiB plan, graphed, no cap
PLAN_AUTO_CAP = "2026-11-28-4xH200-zero-sharding-plan-auto-cap.json"  # the same plan under auto and the cap
ZBV_GRAPHED = "2026-11-28-4xH200-pp4-schedules-zbv-graphed.json"  # the GPT's zbv at pp4, its I graphed and eager
PP4_SCHEDULES = "2026-11-27-4xH100-pp4-schedules.json"
SPLIT = "2026-11-28-4xH200-pp4-schedules-split-blocks.json"  # the GPT at pp4, stages ending inside blocks or not
SPLIT_LOGS = "2026-11-28-4xH200-pp4-schedules-split-blocks-logs.tgz"
SPLIT_REPEAT = "2026-11-28-4xH200-pp4-schedules-split-blocks-repeat.json"  # zbv and torch's ZBV again, a later job
SPLIT_LLAMA = "2026-11-28-4xH200-graphs-llama-split-blocks.json"  # the Llama-1B class at pp4 and pp2 x tp2, the same
KERNELS_8B = "2026-11-27-4xH100-kernels-8b-pp4.json"
STEP_PASS = "2026-11-27-4xH200-transformer-step.json"
HEAD_AB = "2026-11-27-2xH200-transformer-step-head-ab.json"
FP8_TEXT = "2026-11-28-2xH200-fp8-realtext.json"  # 400 steps of real text, bf16 and fp8, eager
FP8_GRAPHED = "2026-11-28-1xH200-fp8-graphed-step.json"  # the same model and batch graphed on one H200
KERNELS_8B_H200 = "2026-11-27-4xH200-kernels-8b-pp4-fp8-{}.json"
FP8_PROFILE = "2026-11-27-4xH200-fp8-kernels-profile-categories.json"
LINEAR_BENCH = "2026-11-27-1xH200-fp8-linear-bench.jsonl"
LONG_SEQ_DOC = "docs/long_sequences.md"
LONG_SEQ4_LATER = "2026-11-28-4xH200-long-seq-one-gpu-128k.json"  # one GPU at 32k and 64k, cp2 x tp2 at 128k
LONG_SEQ4_LATER_LOGS = "2026-11-28-4xH200-long-seq-one-gpu-128k-logs.tgz"
LONG_SEQ_64K = "2026-11-28-4xH200-long-seq-one-gpu-64k-graphed.json"  # one GPU at 64k, its graphs captured
LONG_SEQ_64K_LOGS = "2026-11-28-4xH200-long-seq-one-gpu-64k-graphed-logs.tgz"
CP_SHORT = "2026-11-28-4xH200-cp4-16k-ring-gather.json"  # cp4 at 16k over 10 steps, and each rank's profile


def _first_step_peak(run: str) -> float:
    """A run's first step's peak GiB, from its metrics file in the job's logs (the run failed after it)."""
    with tarfile.open(os.path.join(RESULTS, "raw", LONG_SEQ4_LATER_LOGS)) as logs:
        first = logs.extractfile(f"./{run}.jsonl").read().decode().splitlines()[0]
    return json.loads(first)["peak_mem_gib"][0]


def _reserved_peak(logs_file: str, run: str) -> float:
    """The most GiB a run's allocator reserved on any rank and step (a graphed run's pools show there, not in its
    allocated peak), from its metrics file in the job's logs."""
    with tarfile.open(os.path.join(RESULTS, "raw", logs_file)) as logs:
        lines = logs.extractfile(f"./{run}.jsonl").read().decode().splitlines()
    return max(p for line in lines for p in json.loads(line).get("peak_reserved_gib") or [])


def _summary(logs_file: str, run: str) -> dict:
    """A run's closing summary record (its predictions beside what it measured), from the job's logs."""
    with tarfile.open(os.path.join(RESULTS, "raw", logs_file)) as logs:
        lines = logs.extractfile(f"./{run}.jsonl").read().decode().splitlines()
    return [json.loads(line)["summary"] for line in lines if '"summary"' in line][-1]


def _cp_short(variant: str) -> dict:
    """A variant (ring, all-gather) of the short context-parallel pass."""
    return results(CP_SHORT)["variants"][variant]
ATTENTION_BENCH = "raw/2026-11-28-1xH200-attention-kernels.jsonl"
GRID_NAMES = {"mp4": "dp1 pp1 mp4", "pp4": "dp1 pp4 mp1", "pp2 × mp2": "dp1 pp2 mp2", "dp2 × pp2": "dp2 pp2 mp1",
              "dp4": "dp4 pp1 mp1"}


def _fused_ab(which: str, run: str, tree: str) -> float:
    return results(FUSED_AB.format(which))["median_step_ms"][run][f"{tree}_ms"]


def _block_kernels(bound) -> str:
    """The least or the most (bound: min, max) of flash's forward and backward time over cuDNN's on the blocks of cp4
    at 32k, as the attention kernels' bench measured them."""
    rows = [r for r in results(ATTENTION_BENCH) if r.get("shape", "").startswith("cp4_32k")]
    return fixed(2)(bound((r["flash_fwd_ms"] + r["flash_bwd_ms"]) / (r["cudnn_fwd_ms"] + r["cudnn_bwd_ms"])
                          for r in rows))


def _head_ab(run: str) -> str:
    return fixed(2)(results(HEAD_AB)["runs"][run]["step_ms"])


def _kernels_8b(name: str, run: str) -> dict:
    return results(name)["runs"][run] if run == "llama8b_bf16" else results(name)["ratios"][run]


def _fp8_profile() -> dict:
    return results(FP8_PROFILE)["runs"]["l4_fp8-rank0"]


def _gate_bench() -> dict:
    """The linear bench's gate projection (M 4096, K 4096, N 14336), tensor-wise."""
    return next(r for r in results(LINEAR_BENCH) if (r["k"], r["n"], r["recipe"]) == (4096, 14336, "tensorwise"))


def _pp4(run: str) -> dict:
    return results(PP4_SCHEDULES)["runs"][f"engine_pp4_{run}"]


def _split(run: str) -> dict:
    return results(SPLIT)["runs"][f"engine_pp4_{run}"]


def _planned_ms(logs: str, run: str) -> str:
    """The step a run's plan line predicted, as it printed it ("plan: ... predicted N ms/step")."""
    with tarfile.open(os.path.join(RESULTS, "raw", logs)) as tar:
        text = tar.extractfile(f"./{run}.log").read().decode()
    return next(line for line in text.splitlines() if line.startswith("plan: ")).split("predicted ")[1].split(" ")[0]


def _graphs(grid: str, config: str) -> dict:
    """A grid's comparison of the graphs pass (off and on), by the grid's name on the page."""
    return next(c for c in results(GRAPHS)["comparisons"]
                if c["grid"] == GRID_NAMES.get(grid, grid) and c["config"] == config)


def _graphs_one_gpu(grid: str, config: str, graphs: str = "on") -> str:
    """One GPU's eager step at the grid's micro-batches over the grid's step (graphed, or eager)."""
    row = _graphs(grid, config)
    one = next(c for c in results(GRAPHS)["comparisons"] if c["grid"] == "dp1 pp1 mp1"
               and c["config"] == config and c["micro_batches"] == row["micro_batches"])
    return ratio(one["off_ms"], row[f"{graphs}_ms"])


STEP_CLAIMS = [
    # docs/kernels.md: why auto leaves the elementwise modules unfused
    ("docs/kernels.md", "ran {} ms a step with every fusion and {} without",
     lambda: fixed(2)(results(KERNELS_1B)["median_step_ms"]["fused_kernels_on"]),
     lambda: fixed(2)(results(KERNELS_1B)["median_step_ms"]["fused_kernels_off"])),
    ("docs/kernels.md", "the tree ran {} and {} ms beside the unfused older tree's {} and {} in the same job, and with "
     "`--fused-kernels off` {} and {} beside {} and {} in another",
     *[lambda w=w, r=r, t=t: fixed(2)(_fused_ab(w, r, t)) for w in ("on", "off") for t in ("new", "old")
       for r in ("pp2tp2", "pp2tp2_2")]),
    *[(LONG_SEQ_DOC, f"| {label} * | {{}} | {{}}% | {{}}% | {{}} |",
       lambda run=run: comma(long_seq4(run, LONG_SEQ4_LATER)["tokens_s"]),
       lambda run=run: pct()(long_seq4(run, LONG_SEQ4_LATER)["mfu"]),
       lambda run=run: pct()(long_seq4(run, LONG_SEQ4_LATER)["mfu_causal"]),
       lambda run=run: fixed(1)(max(long_seq4(run, LONG_SEQ4_LATER)["peak_gib_per_gpu"])))
      for label, run in (("cp2 × tp2, 128k", "cp2tp2_128k"), ("one GPU, 32k", "gpu1_32k"))],
    (LONG_SEQ_DOC, "eager step at {} GiB and ran out of memory capturing its CUDA graphs at the second",
     lambda: fixed(1)(_first_step_peak("gpu1_64k"))),
    (LONG_SEQ_DOC, "| one GPU, 64k † | {} | {}% | {}% | {} |",
     lambda: comma(long_seq4("gpu1_64k", LONG_SEQ_64K)["tokens_s"]),
     lambda: pct()(long_seq4("gpu1_64k", LONG_SEQ_64K)["mfu"]),
     lambda: pct()(long_seq4("gpu1_64k", LONG_SEQ_64K)["mfu_causal"]),
     lambda: fixed(1)(max(long_seq4("gpu1_64k", LONG_SEQ_64K)["peak_gib_per_gpu"]))),
    (LONG_SEQ_DOC, "graphs a single GPU's stages): {} GiB reserved, where the planner predicts {}.",
     lambda: fixed(1)(_reserved_peak(LONG_SEQ_64K_LOGS, "gpu1_64k")),
     lambda: fixed(1)(_summary(LONG_SEQ_64K_LOGS, "gpu1_64k")["predicted_peak_mem_gib"])),
    (LONG_SEQ_DOC, "cp4 at 32k moves {}× the tokens a second of one GPU at 32k",
     lambda: ratio(long_seq4("cp4_32k")["tokens_s"], long_seq4("gpu1_32k", LONG_SEQ4_LATER)["tokens_s"])),
    (LONG_SEQ_DOC, "the ring took {} ms a step ({} to {}) and the all-gather {} ms: {}×",
     lambda: fixed(1)(_cp_short("ring")["step_ms"]), lambda: fixed(1)(_cp_short("ring")["min_ms"]),
     lambda: fixed(1)(_cp_short("ring")["max_ms"]), lambda: fixed(1)(_cp_short("all-gather")["step_ms"]),
     lambda: fixed(2)(results(CP_SHORT)["all_gather_over_ring"])),
    (LONG_SEQ_DOC, "far above the cost model's {} ms", lambda: fixed(1)(_cp_short("ring")["predicted_ms"])),
    (LONG_SEQ_DOC, "holds {} to {} ms of compute kernels a step for the ring, near the model's step, beside {} to {} "
     "ms of NCCL kernels",
     *[lambda kind=kind, pick=pick: fixed(1)(pick(r[f"{kind}_kernels_ms"]
                                                   for r in _cp_short("ring")["per_rank_profile"]))
       for kind in ("compute", "nccl") for pick in (min, max)]),
    (LONG_SEQ_DOC, "the flash kernel ran the blocks of cp4 at 32k {} to {}× slower than cuDNN's",
     lambda: _block_kernels(min), lambda: _block_kernels(max)),
    *[(PERF, f"| {grid} | {config} | {{}} | {{}} | {{}} | {{}}× | {{}}× |",
       lambda g=grid, c=config: str(_graphs(g, c)["micro_batches"]),
       lambda g=grid, c=config: fixed(2)(_graphs(g, c)["off_ms"]),
       lambda g=grid, c=config: fixed(2)(_graphs(g, c)["on_ms"]),
       lambda g=grid, c=config: ratio(_graphs(g, c)["off_ms"], _graphs(g, c)["on_ms"]),
       lambda g=grid, c=config: _graphs_one_gpu(g, c))
      for grid in GRID_NAMES for config in ("C", "L")],
    ("docs/kernels.md", "that took {} ms a micro-batch, against {} ms for a product written in bf16, copied to fp32 "
     "and added, {}×",
     lambda: str(results(STEP_PASS)["head_bench"]["fused_ms"]),
     lambda: fixed(2)(results(STEP_PASS)["head_bench"]["half_ms"]),
     lambda: fixed(2)(results(STEP_PASS)["head_bench"]["half_over_fused"])),
    ("docs/kernels.md", "bf16 {} ms a step against {} ({}×), fp8 {} against {} ({}×)",
     lambda: _head_ab("l4_bf16"), lambda: _head_ab("l4_bf16_old"),
     lambda: fixed(2)(results(HEAD_AB)["new_over_old"]["l4_bf16"]["tokens_per_s_ratio"]),
     lambda: _head_ab("l4_fp8"), lambda: _head_ab("l4_fp8_old"),
     lambda: fixed(2)(results(HEAD_AB)["new_over_old"]["l4_fp8"]["tokens_per_s_ratio"])),
    *[("docs/kernels.md", f"| {label} | {card} | {{}} | {{}}× | {{}}× |",
       lambda f=f: comma(_kernels_8b(f, "llama8b_bf16")["per_s"]),
       *[lambda f=f, r=r: fixed(2)(_kernels_8b(f, f"llama8b_fp8_{r}")["tokens_per_s_ratio"])
         for r in ("tensorwise", "rowwise")])
      for label, card, f in (
          ("each GEMM's operands from scratch, weights every micro-batch", "4 × H100", KERNELS_8B),
          ("each operand once, weights once a step, compiled regions", "4 × H200", KERNELS_8B_H200.format("reuse")),
          ("the same, Triton casts and ATen maxima", "4 × H200", KERNELS_8B_H200.format("kernels")))],
    ("docs/kernels.md", "validation loss after the last step {} in bf16 and {} in fp8, {}% apart (the goal is 1%; the "
     "largest gap at any evaluation {}%)",
     lambda: fixed(4)(results(FP8_TEXT)["runs"]["bf16"]["final_val_loss"]),
     lambda: fixed(4)(results(FP8_TEXT)["runs"]["fp8"]["final_val_loss"]),
     lambda: fixed(2)(100 * results(FP8_TEXT)["target"]["final_rel_diff"]),
     lambda: fixed(2)(100 * results(FP8_TEXT)["target"]["max_rel_diff"])),
    ("docs/kernels.md", "there fp8 ran {}× bf16's tokens/s",
     lambda: fixed(2)(results(FP8_TEXT)["fp8_over_bf16_tokens_s"])),
    ("docs/kernels.md", "the same model and batch ran fp8 at {} tokens/s against bf16's {} ({}×), and bf16 itself {}× "
     "its eager run",
     lambda: comma(results(FP8_GRAPHED)["runs"]["fp8"]["tokens_s"]),
     lambda: comma(results(FP8_GRAPHED)["runs"]["bf16"]["tokens_s"]),
     lambda: ratio(results(FP8_GRAPHED)["runs"]["fp8"]["tokens_s"], results(FP8_GRAPHED)["runs"]["bf16"]["tokens_s"]),
     lambda: ratio(results(FP8_GRAPHED)["runs"]["bf16"]["tokens_s"], results(FP8_TEXT)["runs"]["bf16"]["tokens_s"])),
    ("docs/kernels.md", "fp8 tensor-wise ran {}× bf16 after the head's one-GEMM weight gradient",
     lambda: fixed(2)(results(HEAD_AB)["ratios"]["l4_fp8"]["tokens_per_s_ratio"])),
    ("docs/kernels.md", "of {} ms of device time over its 4 steps, the GEMMs took {} ms",
     lambda: str(_fp8_profile()["gpu_busy_ms"]),
     lambda: fixed(1)(_fp8_profile()["device_ms"]["head_gemm"] + _fp8_profile()["device_ms"]["gemm"])),
    ("docs/kernels.md", "the quantization {} ms (its casts at about a third of the card's bandwidth); the main-grad "
     "additions {} ms",
     lambda: fixed(1)(_fp8_profile()["device_ms"]["fp8_cast"] + _fp8_profile()["device_ms"]["fp8_amax"]),
     lambda: str(_fp8_profile()["device_ms"]["main_grad_add"])),
    ("docs/kernels.md", "whose fp8 kernels ran {}× the bf16 ones' rate",
     lambda: ratio(_gate_bench()["fp8_gemm_tflops"], _gate_bench()["bf16_tflops"])),
    ("docs/kernels.md", "{} ms for its forward and backward in bf16, {} in fp8 with its weight cached",
     lambda: fixed(2)(_gate_bench()["ms"]["bf16 nn.Linear forward+backward"]),
     lambda: fixed(2)(_gate_bench()["ms"]["fp8 forward+backward, weight cached (8 micro-batches a step)"])),
    (PERF, "the 8B layer shape cut to 4 layers ran {} ms a step graphed against {} eager on one H200",
     lambda: fixed(2)(results(STEP_PASS)["runs"]["l4_bf16_graphs"]["step_ms"]),
     lambda: fixed(2)(results(STEP_PASS)["runs"]["l4_bf16"]["step_ms"])),
    ("docs/schedules.md",
     "1f1b ran {} tokens/s ({} ms a step), zbv {} ({} ms, {}× 1f1b) and dualpipev {} ({} ms, {}×)",
     lambda: comma(_pp4("1f1b")["tokens_s"]), lambda: fixed(2)(_pp4("1f1b")["step_ms"]),
     *[f for v in ("zbv", "dualpipev") for f in (lambda v=v: comma(_pp4(v)["tokens_s"]),
                                                  lambda v=v: fixed(2)(_pp4(v)["step_ms"]),
                                                  lambda v=v: ratio(_pp4(v)["tokens_s"], _pp4("1f1b")["tokens_s"]))]),
    (PERF, "bf16) on 4 × H200 ran {}× graphed against eager on one GPU, {}× at tp4, {}× at pp4 and {}× at "
           "pp2 × tp2", *[lambda g=g: fixed(2)(results(GRAPHS_LLAMA)["ratios"][g]["on_vs_off"])
                          for g in ("gpu1", "tp4", "pp4", "pp2tp2")]),
    (PERF, "tp4 ran {}× the eager run of the same job ({} against {} tokens/s), pp4 {} and pp2 × tp2 {} tokens/s",
     lambda: fixed(2)(results(GRAPHS_AUTO)["ratios"]["tp4"]["on_vs_off"]),
     *[lambda r=r: comma(results(GRAPHS_AUTO)["runs"][r]["per_s"]) for r in ("tp4_on", "tp4_off", "pp4_on",
                                                                               "pp2tp2_on")]),
    (PERF, "graphed on the H200s' own memory reserved {} GiB on its first stage (the planner predicts {}) against {} "
     "eagerly, at the eager run's speed ({} against {} tokens/s",
     lambda: fixed(1)(results(PLAN_UNCAPPED)["runs"]["plan_dp2pp2_graphed"]["reserved_gib"]),
     lambda: fixed(1)(results(PLAN_UNCAPPED)["runs"]["plan_dp2pp2_graphed"]["predicted_peak_gib"]),
     lambda: fixed(1)(results(PLAN_UNCAPPED)["runs"]["plan_dp2pp2"]["reserved_gib"]),
     lambda: comma(results(PLAN_UNCAPPED)["runs"]["plan_dp2pp2_graphed"]["tokens_s"]),
     lambda: comma(results(PLAN_UNCAPPED)["runs"]["plan_dp2pp2"]["tokens_s"])),
    (PERF, "ran zbv at {} ms a step graphed against {} eager in one job",
     lambda: fixed(2)(results(ZBV_GRAPHED)["runs"]["engine_pp4_zbv"]["step_ms"]),
     lambda: fixed(2)(results(ZBV_GRAPHED)["runs"]["engine_pp4_zbv_eager"]["step_ms"])),
    (PERF, "and it trains at {} tokens/s", lambda: comma(results(PLAN_AUTO_CAP)["runs"]["plan_auto"]["tokens_s"])),
    ("docs/schedules.md", "zbv ran {} tokens/s ({} ms a step, the planner predicted {}) against {} with whole blocks "
                          "({} ms), {}×; interleaved (v2) {} against {}; auto's own plan, dualpipev, {} ({} of the",
     lambda: comma(_split("zbv")["tokens_s"]), lambda: fixed(2)(_split("zbv")["step_ms"]),
     lambda: _planned_ms(SPLIT_LOGS, "engine_pp4_zbv"), lambda: comma(_split("zbv_whole")["tokens_s"]),
     lambda: fixed(2)(_split("zbv_whole")["step_ms"]),
     lambda: ratio(_split("zbv")["tokens_s"], _split("zbv_whole")["tokens_s"]),
     lambda: comma(_split("interleaved")["tokens_s"]), lambda: comma(_split("interleaved_whole")["tokens_s"]),
     lambda: comma(_split("auto")["tokens_s"]), lambda: ratio(_split("auto")["tokens_s"], _split("zbv")["tokens_s"])),
    ("docs/schedules.md", "and runs {} tokens/s against {} with whole blocks; at pp2 × tp2 auto keeps whole blocks ({} "
                          "and {} with `off`)",
     *[lambda r=r: comma(results(SPLIT_LLAMA)["runs"][r]["per_s"]) for r in ("pp4_on", "pp4w_on", "pp2tp2_on",
                                                                            "pp2tp2w_on")]),
    ("docs/schedules.md", "(a second job: {} against {}, {}×,",
     lambda: comma(results(SPLIT_REPEAT)["runs"]["engine_pp4_zbv"]["tokens_s"]),
     lambda: comma(results(SPLIT_REPEAT)["runs"]["torch_pp4_zbv"]["tokens_s"]),
     lambda: fixed(2)(results(SPLIT_REPEAT)["engine_best_vs_torch_best"]["value"])),
    ("docs/schedules.md", "torch pipelining's ZBV on whole blocks ran {}: the engine's best is {}× torch's",
     lambda: comma(results(SPLIT)["runs"]["torch_pp4_zbv"]["tokens_s"]),
     lambda: fixed(2)(results(SPLIT)["engine_best_vs_torch_best"]["value"])),
    (PERF, "one GPU at 64k tokens captures and trains graphed ({} GiB reserved",
     lambda: fixed(1)(_reserved_peak(LONG_SEQ_64K_LOGS, "gpu1_64k"))),
    (PERF, "Graphs pay where launches are most of the step: config C's 64 rows at mp4, {}×.",
     lambda: ratio(_graphs("mp4", "C")["off_ms"], _graphs("mp4", "C")["on_ms"])),
    (PERF, "at dp4, L's replayed backward exposes the gradient all-reduce that its eager layers hid ({}×)",
     lambda: ratio(_graphs("dp4", "L")["off_ms"], _graphs("dp4", "L")["on_ms"])),
    (PERF, "Config L reaches {}× one GPU at pp4 and {}× at mp4",
     lambda: _graphs_one_gpu("pp4", "L"), lambda: _graphs_one_gpu("mp4", "L")),
    (PERF, "and {}× and {}× eagerly", lambda: _graphs_one_gpu("pp4", "L", "off"),
     lambda: _graphs_one_gpu("mp4", "L", "off")),
]
