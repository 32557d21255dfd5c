#!/usr/bin/env bash
# One device call (~7 min, 2 GPUs) after the native-stage and fused-unscale changes: the GPU unit tests, then
# each issue-#6 target's two sides in one job (engine beside base and peer), the engine's native stages
# against the autograd stages they replace (--autograd-stages: the A/B), data parallelism (1 GPU, dp=2 strong
# and weak), L in bf16 with mp=2 against DTensor TP, and traced 1F1B runs of L and X (the measured bubble).
# Logs, metrics and traces land in ${OUT:-/tmp/he_out}/ab_pass.tgz; experiments/pass_results.py ab turns them
# into a results file.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4
OUT=${OUT:-/tmp/he_out}; RES=/tmp/ab_pass; mkdir -p "$OUT" "$RES"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$RES/build.log" 2>&1 || { tail -40 "$RES/build.log"; exit 1; }
timeout 150 python3 -X faulthandler -m pytest -q -x tests/test_fused_sgd.py tests/test_nonfinite_flag.py \
  > "$RES/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$? $(tail -1 "$RES/pytest_gpu.txt")"
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0"
C="--dim 8192 --depth 8 --batch-size 64 --micro-batches 4 --steps 10 --warmup 3 --seed 0"
Lw="--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0"
X="--dim 8192 --depth 16 --batch-size 16384 --micro-batches 8 --steps 4 --warmup 1 --seed 0"
BEST="--schedule zb1 --merge-wgrad --lookahead 1"
engine() {  # name nproc args...
  local name=$1 n=$2; shift 2
  timeout 120 torchrun --nproc_per_node="$n" hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" "$@" \
    > "$RES/$name.log" 2>&1 || { echo "$name FAILED"; tail -4 "$RES/$name.log"; }
  echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}
program() {  # name nproc script args...
  local name=$1 n=$2 script=$3; shift 3
  timeout 120 torchrun --nproc_per_node="$n" "experiments/$script" "$@" > "$RES/$name.log" 2>&1 \
    || { echo "$name FAILED"; tail -4 "$RES/$name.log"; }
  echo "$name: $(grep -o '"samples_s": [0-9.]*' "$RES/$name.log" | tail -1)"
}
engine C_fp16_zb1m 2 --pp 2 $C --amp fp16 $BEST
engine C_fp16_zb1m_autograd 2 --pp 2 $C --amp fp16 $BEST --autograd-stages
program C_fp16_peer 2 peer_torch_pipelining.py --mode 1f1b $C --amp fp16
program C_fp16_base 1 baseline_practical10.py $C --amp fp16
engine L_fp16_zb1m 2 --pp 2 $L --amp fp16 $BEST
engine L_fp16_zb1m_autograd 2 --pp 2 $L --amp fp16 $BEST --autograd-stages
program L_fp16_peer 2 peer_torch_pipelining.py --mode 1f1b $L --amp fp16
program L_fp16_base 1 baseline_practical10.py $L --amp fp16
engine L_fp16_single 1 $L --amp fp16
engine L_fp16_dp2 2 --dp 2 $L --amp fp16 --micro-batches 4
engine Lw_fp16_dp2 2 --dp 2 $Lw --amp fp16
engine L_bf16_tp 2 --mp 2 $L --amp bf16
program L_bf16_peer_tp 2 peer_torch_pipelining.py --mode tp $L --amp bf16
mkdir -p "$RES/traces"
engine L_fp16_1f1b_traced 2 --pp 2 $L --amp fp16 --schedule 1f1b --trace "$RES/traces/L_fp16_1f1b_pp2"
engine L_fp32_1f1b_traced 2 --pp 2 $L --schedule 1f1b --trace "$RES/traces/L_fp32_1f1b_pp2"
engine X_fp16_1f1b_traced 2 --pp 2 $X --amp fp16 --schedule 1f1b --trace "$RES/traces/X_fp16_1f1b_pp2"
tar czf "$OUT/ab_pass.tgz" -C "$RES" .
