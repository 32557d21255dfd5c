#!/usr/bin/env bash
# First look on a GPU machine: build against its torch, check that 1 GPU, pp=2, mp=2 and dp=2 train the same
# losses, then time config L (pp=2) in fp32 and fp16. Writes logs and metrics under ${OUT:-/tmp/he_out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/he_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
start=$(date +%s)
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
run() {  # name nproc args...
  local name=$1 n=$2; shift 2
  timeout 240 torchrun --nproc_per_node="$n" hybrid_engine.py --metrics "$OUT/$name.jsonl" --quiet "$@" \
    > "$OUT/$name.log" 2>&1 || { echo "$name FAILED"; tail -5 "$OUT/$name.log"; }
  grep summary "$OUT/$name.log" | sed "s/^/$name: /"
}
SMALL="--dim 1024 --depth 8 --batch-size 64 --micro-batches 4 --steps 5 --warmup 1 --lr 0.05"
run small_1gpu 1 $SMALL
run small_pp2 2 --pp 2 $SMALL
run small_mp2 2 --mp 2 $SMALL
run small_dp2 2 --dp 2 $SMALL
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def losses(n): return [json.loads(l)["loss"] for l in open(f"{out}/{n}.jsonl")]
ref = losses("small_1gpu")
for n in ("small_pp2", "small_mp2", "small_dp2"):
    got = losses(n)
    rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"{n}: max relative loss difference vs 1 GPU {rel:.2e}")
PY
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3"
run L_fp32_1f1b 2 --pp 2 $L
run L_fp16_hw_1f1b 2 --pp 2 $L --amp fp16
run L_fp16_hw_zb1m 2 --pp 2 $L --amp fp16 --schedule zb1 --merge-wgrad
run L_fp16_ac_1f1b 2 --pp 2 $L --amp fp16 --amp-impl autocast
run L_bf16_hw_zb1m 2 --pp 2 $L --amp bf16 --schedule zb1 --merge-wgrad
echo "total: $(( $(date +%s) - start )) s"
