#!/usr/bin/env bash
# The last short device call (~3.5 min, 2 GPUs): build, the GPU unit tests of our CUDA kernel, the max-batch
# search at pp=2 (fp32, fp16, fp16 + recompute side by side, each trial capped at 8 GiB), then config L in
# bf16 under both half-precision implementations. Everything is written under ${OUT:-/tmp/he_out} as it
# completes, so a run cut short still returns what it finished.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/he_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
timeout 60 python3 -X faulthandler -m pytest -q tests/test_fused_sgd.py > "$OUT/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$? $(tail -1 "$OUT/pytest_gpu.txt")"
timeout 130 python3 experiments/max_batch.py --modes fp32,fp16,fp16-recompute --dim 4096 --depth 16 --schedule 1f1b \
  --driver-args "--memory-cap-gib 8" --parallel 3 --time-budget 110 --trial-timeout 50 --out "$OUT" \
  > "$OUT/max_batch_stdout.txt" 2>&1
echo "max_batch rc=$?"; grep -E '"kind": "(result|ratios)"' "$OUT"/*maxbatch.jsonl | cut -c1-240
L="--pp 2 --dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0 --amp bf16"
for run in "bf16_autocast_1f1b|--amp-impl autocast --schedule 1f1b" \
           "bf16_halfweights_1f1b|--schedule 1f1b" \
           "bf16_halfweights_zb1m_ahead1|--schedule zb1 --merge-wgrad --lookahead 1"; do
  name=${run%%|*}; flags=${run#*|}
  timeout 60 torchrun --nproc_per_node=2 hybrid_engine.py $L $flags --quiet --metrics "$OUT/L_$name.jsonl" \
    > "$OUT/L_$name.log" 2>&1 || tail -3 "$OUT/L_$name.log"
  echo "L $name: $(grep -o 'median step.*' "$OUT/L_$name.log")"
done
