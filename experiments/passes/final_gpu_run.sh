#!/usr/bin/env bash
# The last measurement pass on 2 GPUs (one device call, < 10 min): rebuild, re-time configs L and C in fp16
# after the last optimisations, fp16-vs-fp32 convergence on config L (200 steps), and the max-batch search.
# Everything lands in ${OUT:-/tmp/he_out}/final.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/he_out}; RES=/tmp/final_results; mkdir -p "$OUT" "$RES"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$RES/build.log" 2>&1 || { tail -30 "$RES/build.log"; exit 1; }

# 1. configs L and C, fp16: base, peer, engine side by side again
timeout 200 python3 experiments/bench/bench.py --configs L,C --precs fp16 --time-budget 130 --run-timeout 60 --no-trace \
  --out "$RES" > "$RES/bench_stdout.txt" 2>&1
grep -E "^\[|vs_peer|vs_base|scaling|tp " "$RES/bench_stdout.txt" | head -30

# 2. fp16 vs fp32 on config L, 200 steps each, same data and initial weights
L="--pp 2 --dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --schedule zb1 --merge-wgrad --steps 200 --warmup 3 --quiet"
for prec in fp32 fp16; do
  amp=$([ $prec = fp16 ] && echo "--amp fp16" || echo "")
  timeout 100 torchrun --nproc_per_node=2 hybrid_engine.py $L $amp --metrics "$RES/convergence_$prec.jsonl" \
    > "$RES/convergence_$prec.log" 2>&1 || tail -3 "$RES/convergence_$prec.log"
done
python3 - "$RES" <<'PY'
import json, sys, datetime
from hybrid_engine.metrics import records
res = sys.argv[1]
curves = {p: [r["loss"] for r in records.steps(records.read(f"{res}/convergence_{p}.jsonl"))] for p in ("fp32", "fp16")}
out = {"config": "L", "schedule": "zb1 --merge-wgrad", "pp": 2, "steps": 200, **curves,
       "final_relative_difference": abs(curves["fp16"][-1] - curves["fp32"][-1]) / curves["fp32"][-1]}
json.dump(out, open(f"{res}/{datetime.date.today()}-2xH200-convergence.json", "w"))
print("convergence: fp32 final", curves["fp32"][-1], "fp16 final", curves["fp16"][-1],
      "relative difference", out["final_relative_difference"])
PY

# 3. max batch at pp=2 (dim 4096, depth 16, 1F1B; every trial capped at 8 GiB of GPU memory so trials stay short)
for mode in fp32 fp16 fp16-recompute; do
  timeout 110 python3 experiments/bench/max_batch.py --modes $mode --dim 4096 --depth 16 --schedule 1f1b \
    --driver-args "--memory-cap-gib 8" --time-budget 95 --trial-timeout 40 --out "$RES" 2>&1 | tail -3
done
tar czf "$OUT/final.tgz" -C "$RES" .
