#!/usr/bin/env bash
# The max-batch device call (~6 min, 2 GPUs): build, then the max-batch search at pp=2 (fp32, fp16, fp16 +
# recompute side by side, each trial capped at 8 GiB, micro-batches streamed: the driver's --stream-data), under
# 1F1B (8 micro-batches, the engine's default) and under GPipe (16 micro-batches: every micro-batch in flight,
# where recomputation pays). Everything is written under ${OUT:-/tmp/he_out} as it completes, so a run cut
# short still returns what it finished.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/he_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
search() {  # name max_batch args...
  local name=$1; shift
  timeout 170 python3 experiments/bench/max_batch.py --modes fp32,fp16,fp16-recompute --dim 4096 --depth 16 \
    --driver-args "--memory-cap-gib 8 --stream-data" --parallel 6 --time-budget 150 --trial-timeout 60 \
    --out "$OUT/$name" "$@" > "$OUT/$name.stdout.txt" 2>&1
  echo "$name rc=$?"; grep -hE '"kind": "(result|ratios)"' "$OUT/$name"/*maxbatch.jsonl | cut -c1-260
}
search maxbatch_1f1b --schedule 1f1b --micro-batches 8
search maxbatch_gpipe --schedule gpipe --micro-batches 16
