#!/usr/bin/env python3
"""Turn the logs of a short device pass into a bench-format results file (same records, same ratios).

    python experiments/analysis/pass_results.py {tune,final} LOG_DIR OUT.json [--meta-from RESULTS.json]

tune: experiments/passes/tune_pass.sh runs base, peer and engine of configs L and C side by side in one job, like
bench.py, but names its runs itself; final: experiments/passes/final_pass.sh's config-L bf16 runs (its max-batch
search writes its own file). PASSES says which run each log is. Engine records come from the driver's --metrics file, base
and peer records from the JSON line their programs print. The card's probe (GEMM peak, copy rates) is not
re-measured by the pass: --meta-from copies it from an earlier results file of the same card type.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # analysis/ reads bench/, never the reverse
from bench import CONFIGS, Config, Spec, engine_record, program_record, write_results  # noqa: E402

# The pass's shapes: the bench configs with its own step counts (tune_pass.sh: L 8 steps / 3 warm-up, C 10 / 3).
PASS_CONFIGS = {"L": Config(8192, 16, 1024, 8, steps=8, warmup=3), "C": Config(8192, 8, 64, 4, steps=10, warmup=3),
                "Lw": Config(8192, 16, 2048, 8, steps=8, warmup=3), "X": Config(8192, 16, 16384, 8, steps=4, warmup=1)}
assert all(PASS_CONFIGS[c].batch == CONFIGS[c].batch and PASS_CONFIGS[c].micro == CONFIGS[c].micro
           for c in PASS_CONFIGS)

# log name -> (spec fields, the command the pass ran, without torchrun's own flags)
PIPE = "--pp 2"
RUNS: dict[str, tuple[dict, str]] = {
    "L_fp16_zb1m_ahead0": (dict(system="engine", mode="zb1", variant="ahead0", config="L", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $L --amp fp16 --schedule zb1 --merge-wgrad --lookahead 0"),
    "L_fp16_zb1m_ahead1": (dict(system="engine", mode="zb1", config="L", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $L --amp fp16 --schedule zb1 --merge-wgrad --lookahead 1"),
    "L_fp16_zb1m_ahead2": (dict(system="engine", mode="zb1", variant="ahead2", config="L", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $L --amp fp16 --schedule zb1 --merge-wgrad --lookahead 2"),
    "L_fp16_1f1b_ahead1": (dict(system="engine", mode="1f1b", variant="ahead1", config="L", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $L --amp fp16 --schedule 1f1b --lookahead 1"),
    "L_fp16_peer": (dict(system="peer", mode="1f1b", config="L", prec="fp16", pp=2),
                    "experiments/peers/peer_torch_pipelining.py --mode 1f1b $L --amp fp16"),
    "L_fp16_base": (dict(system="base", mode="practical10", config="L", prec="fp16", pp=2),
                    "experiments/peers/baseline_practical10.py $L --amp fp16"),
    "C_fp16_zb1m_ahead0": (dict(system="engine", mode="zb1", variant="ahead0", config="C", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $C --amp fp16 --schedule zb1 --merge-wgrad --lookahead 0"),
    "C_fp16_zb1m_ahead1": (dict(system="engine", mode="zb1", config="C", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $C --amp fp16 --schedule zb1 --merge-wgrad --lookahead 1"),
    "C_fp16_zb1m_ahead2": (dict(system="engine", mode="zb1", variant="ahead2", config="C", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $C --amp fp16 --schedule zb1 --merge-wgrad --lookahead 2"),
    "C_fp16_zb1m_ahead3": (dict(system="engine", mode="zb1", variant="ahead3", config="C", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $C --amp fp16 --schedule zb1 --merge-wgrad --lookahead 3"),
    "C_fp16_peer": (dict(system="peer", mode="1f1b", config="C", prec="fp16", pp=2),
                    "experiments/peers/peer_torch_pipelining.py --mode 1f1b $C --amp fp16"),
    "C_fp16_base": (dict(system="base", mode="practical10", config="C", prec="fp16", pp=2),
                    "experiments/peers/baseline_practical10.py $C --amp fp16"),
    "L_fp16_single": (dict(system="engine", mode="single", config="L", prec="fp16"),
                      "hybrid_engine.py $L --amp fp16"),
    # dp=2 at L's global batch with L's 8 micro-batches per replica: 64-row micro-batches (bench.py instead
    # halves the micro-batch count to keep 128 rows: a different run, so a different variant name)
    "L_fp16_dp2": (dict(system="engine", mode="dp", variant="m8", config="L", prec="fp16", dp=2),
                   "hybrid_engine.py --dp 2 $L --amp fp16"),
    "Lw_fp16_dp2": (dict(system="engine", mode="dp", config="Lw", prec="fp16", dp=2),
                    "hybrid_engine.py --dp 2 $Lw --amp fp16"),
}
# final_pass.sh: L in bf16, the two half-precision implementations under one schedule, and the fastest setting
FINAL_RUNS: dict[str, tuple[dict, str]] = {
    "L_bf16_autocast_1f1b": (dict(system="engine", mode="1f1b", variant="autocast", config="L", prec="bf16", pp=2),
                             "hybrid_engine.py $L --amp-impl autocast --schedule 1f1b"),
    "L_bf16_halfweights_1f1b": (dict(system="engine", mode="1f1b", config="L", prec="bf16", pp=2),
                                "hybrid_engine.py $L --schedule 1f1b"),
    "L_bf16_halfweights_zb1m_ahead1": (dict(system="engine", mode="zb1", config="L", prec="bf16", pp=2),
                                       "hybrid_engine.py $L --schedule zb1 --merge-wgrad --lookahead 1"),
}
# ab_pass.sh: every target's two sides after the native stages and the fused unscale, with the A/B against
# the autograd stages (variant "autograd"), DP, TP and traced 1F1B runs
BEST = "--schedule zb1 --merge-wgrad --lookahead 1"
AB_RUNS: dict[str, tuple[dict, str]] = {
    "C_fp16_zb1m": (dict(system="engine", mode="zb1", config="C", prec="fp16", pp=2),
                    f"hybrid_engine.py --pp 2 $C --amp fp16 {BEST}"),
    "C_fp16_zb1m_autograd": (dict(system="engine", mode="zb1", variant="autograd", config="C", prec="fp16", pp=2),
                             f"hybrid_engine.py --pp 2 $C --amp fp16 {BEST} --autograd-stages"),
    "C_fp16_peer": RUNS["C_fp16_peer"],
    "C_fp16_base": RUNS["C_fp16_base"],
    "L_fp16_zb1m": (dict(system="engine", mode="zb1", config="L", prec="fp16", pp=2),
                    f"hybrid_engine.py --pp 2 $L --amp fp16 {BEST}"),
    "L_fp16_zb1m_autograd": (dict(system="engine", mode="zb1", variant="autograd", config="L", prec="fp16", pp=2),
                             f"hybrid_engine.py --pp 2 $L --amp fp16 {BEST} --autograd-stages"),
    "L_fp16_peer": RUNS["L_fp16_peer"],
    "L_fp16_base": RUNS["L_fp16_base"],
    "L_fp16_single": RUNS["L_fp16_single"],
    # strong scaling as bench.py runs it: L's batch, the config's micro-batches split over the replicas
    "L_fp16_dp2": (dict(system="engine", mode="dp", config="L", prec="fp16", dp=2),
                   "hybrid_engine.py --dp 2 $L --amp fp16 --micro-batches 4"),
    "Lw_fp16_dp2": RUNS["Lw_fp16_dp2"],
    "L_bf16_tp": (dict(system="engine", mode="tp", config="L", prec="bf16", mp=2),
                  "hybrid_engine.py --mp 2 $L --amp bf16"),
    "L_bf16_peer_tp": (dict(system="peer", mode="tp", config="L", prec="bf16", mp=2),
                       "experiments/peers/peer_torch_pipelining.py --mode tp $L --amp bf16"),
    "L_fp16_1f1b_traced": (dict(system="engine", mode="1f1b", config="L", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $L --amp fp16 --schedule 1f1b --trace traces/L_fp16_1f1b_pp2"),
    "L_fp32_1f1b_traced": (dict(system="engine", mode="1f1b", config="L", prec="fp32", pp=2),
                           "hybrid_engine.py --pp 2 $L --schedule 1f1b --trace traces/L_fp32_1f1b_pp2"),
    "X_fp16_1f1b_traced": (dict(system="engine", mode="1f1b", config="X", prec="fp16", pp=2),
                           "hybrid_engine.py --pp 2 $X --amp fp16 --schedule 1f1b --trace traces/X_fp16_1f1b_pp2"),
}
# dp_pass.sh: data parallelism at L fp16 beside the 1-GPU run of the same flags (default schedule and zb1 + merged
# W, each with the fp32 all-reduce and with bf16 on the wire)
ZB = "--schedule zb1 --merge-wgrad"
DP_RUNS: dict[str, tuple[dict, str]] = {
    "L_single": (dict(system="engine", mode="single", config="L", prec="fp16"), "hybrid_engine.py $L"),
    "L_dp2": (dict(system="engine", mode="dp", config="L", prec="fp16", dp=2),
              "hybrid_engine.py --dp 2 $L --micro-batches 4"),
    "L_dp2_bf16wire": (dict(system="engine", mode="dp", variant="bf16wire", config="L", prec="fp16", dp=2),
                       "hybrid_engine.py --dp 2 $L --micro-batches 4 --dp-grad-dtype bf16"),
    "Lw_dp2": (dict(system="engine", mode="dp", config="Lw", prec="fp16", dp=2), "hybrid_engine.py --dp 2 $Lw"),
    "Lw_dp2_bf16wire": (dict(system="engine", mode="dp", variant="bf16wire", config="Lw", prec="fp16", dp=2),
                        "hybrid_engine.py --dp 2 $Lw --dp-grad-dtype bf16"),
    "L_single_zb1m": (dict(system="engine", mode="single", variant="zb1m", config="L", prec="fp16"),
                      f"hybrid_engine.py $L {ZB}"),
    "L_dp2_zb1m": (dict(system="engine", mode="dp", variant="zb1m", config="L", prec="fp16", dp=2),
                   f"hybrid_engine.py --dp 2 $L --micro-batches 4 {ZB}"),
    "L_dp2_zb1m_bf16wire": (dict(system="engine", mode="dp", variant="zb1m_bf16wire", config="L", prec="fp16", dp=2),
                            f"hybrid_engine.py --dp 2 $L --micro-batches 4 {ZB} --dp-grad-dtype bf16"),
    "Lw_dp2_zb1m": (dict(system="engine", mode="dp", variant="zb1m", config="Lw", prec="fp16", dp=2),
                    f"hybrid_engine.py --dp 2 $Lw {ZB}"),
    "Lw_dp2_zb1m_bf16wire": (dict(system="engine", mode="dp", variant="zb1m_bf16wire", config="Lw", prec="fp16",
                                  dp=2), f"hybrid_engine.py --dp 2 $Lw {ZB} --dp-grad-dtype bf16"),
}
PASSES = {"tune": RUNS, "final": FINAL_RUNS, "ab": AB_RUNS, "dp": DP_RUNS}
# what $L, $C, $Lw stand for in each pass's commands (copied from the scripts)
CMD_VARS = {
    "tune": {"L": "--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0",
             "C": "--dim 8192 --depth 8 --batch-size 64 --micro-batches 4 --steps 10 --warmup 3 --seed 0",
             "Lw": "--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0"},
    "ab": {"L": "--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0",
           "C": "--dim 8192 --depth 8 --batch-size 64 --micro-batches 4 --steps 10 --warmup 3 --seed 0",
           "Lw": "--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0",
           "X": "--dim 8192 --depth 16 --batch-size 16384 --micro-batches 8 --steps 4 --warmup 1 --seed 0"},
    "dp": {"L": "--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0 --amp fp16",
           "Lw": "--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0 --amp fp16"},
    "final": {"L": "--pp 2 --dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0 "
                   "--amp bf16"},
}


def run_record(log_dir: Path, name: str, fields: dict, cmd: str) -> dict:
    spec = Spec(**fields)
    cfg = PASS_CONFIGS[spec.config]
    out = {**fields, "variant": spec.variant, "dp": spec.dp, "pp": spec.pp, "mp": spec.mp, "gpus": spec.gpus,
           "cmd": f"torchrun --nproc_per_node={spec.nproc} {cmd}"}
    try:
        if spec.system == "engine":
            traced = cmd.split("--trace ")[1].split()[0] + ".json" if "--trace " in cmd else None
            rec = engine_record(spec, cfg, str(log_dir / f"{name}.jsonl"),
                                str(log_dir / traced) if traced else None)
        else:
            rec = program_record((log_dir / f"{name}.log").read_text())
        out.update({k: v for k, v in rec.items() if k not in fields})
    except (OSError, ValueError, KeyError) as exc:
        out["error"] = f"{name}: {exc}"
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("which", choices=sorted(PASSES))
    p.add_argument("log_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--meta-from", type=Path, help="results file whose card probe (meta) to copy")
    a = p.parse_args(argv)
    meta = json.loads(a.meta_from.read_text())["meta"] if a.meta_from else {}
    meta = {**meta, "argv": [f"bash experiments/{a.which}_pass.sh"], "cmd_vars": CMD_VARS[a.which],
            "probe_from": a.meta_from.name if a.meta_from else None,
            "configs": {c: asdict(cfg) for c, cfg in PASS_CONFIGS.items()}}
    runs = [run_record(a.log_dir, name, fields, cmd) for name, (fields, cmd) in PASSES[a.which].items()]
    ratios, _ = write_results(a.out, meta, runs, time.monotonic())
    for name, value in ratios.items():
        if value is not None:
            print(f"{name:50s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
