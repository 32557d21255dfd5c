#!/usr/bin/env bash
# Fused kernels and fp8 (issue 38, items 2 and 3), one device call, under one budget (PASS_BUDGET_S, default 540 s):
#
#   1B: the Llama-1B class (hidden 2048, 16 layers, 32/8 heads, ffn 5632, seq 2048, vocabulary 32000, 16 sequences
#       in 8 micro-batches, bf16 half weights, AdamW) on one GPU with --fused-kernels off and on.
#   8B: the 8B shape (hidden 4096, 32 layers, 32/8 heads, ffn 14336, vocabulary 128256, seq 4096, 8 sequences in
#       8 micro-batches, bf16) in bf16 and with --fp8 (tensorwise, then rowwise), fused kernels on in all three, on
#       GRID8B (default "--pp 4", NPROC8B 4 GPUs: what fits 80 GiB a card with fp32 masters and AdamW; on one card
#       pass e.g. GRID8B="" NPROC8B=1 LAYERS8B=4 to time a cut-down stack of the same layer shape).
#   PHASE=1b | 8b | all (default: 1b when one GPU is visible, else all). Runs go in that order; one that no longer
#   fits the budget is skipped and said.
# Every number: tokens/s, model TFLOP/s a GPU, MFU (against the bf16 dense peak, fp8 runs too), peak memory, the last
# loss. Out: $OUT/<date>-<n>x<card>-kernels.json (experiments/analysis/kernels_results.py) and kernels.tgz (logs).
#
#   bash experiments/passes/kernels_pass.sh                         # device kind nvidia-h100-x4 (or x1 for PHASE=1b)
#   SMOKE=1 bash experiments/passes/kernels_pass.sh                 # tiny, on this CPU (gloo ranks): the pass itself
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
SMOKE=${SMOKE:-0}
PY=${PYTHON:-python3}
if [[ $SMOKE == 1 ]]; then
  smoke_start kernels 540 5
  GPUS_SEEN=4; CARD="cpu"; PHASE=${PHASE:-all}
  SHAPE1B="--hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn-hidden 128 --seq-len 32 --vocab-size 512"
  SHAPE8B="--hidden 64 --layers ${LAYERS8B:-4} --heads 4 --kv-heads 2 --ffn-hidden 160 --seq-len 64 --vocab-size 1024"
  RUN1B="--batch-size 4 --micro-batches 2 --steps 4 --warmup 2"
  RUN8B="--batch-size 4 --micro-batches 4 --steps 4 --warmup 2"
  AMP="--amp off"
else
  pass_start kernels
  GPUS_SEEN=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  PHASE=${PHASE:-$( ((GPUS_SEEN > 1)) && echo all || echo 1b)}
  SHAPE1B="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048 --vocab-size 32000"
  SHAPE8B="--hidden 4096 --layers ${LAYERS8B:-32} --heads 32 --kv-heads 8 --ffn-hidden 14336 --seq-len 4096 \
--vocab-size 128256 --rope-theta 500000"
  RUN1B="--batch-size 16 --micro-batches 8 --steps 8 --warmup 3"
  RUN8B="--batch-size 8 --micro-batches 8 --steps 6 --warmup 2"
  AMP="--amp bf16"
fi
[[ $PHASE == 1b || $PHASE == 8b || $PHASE == all ]] || { echo "PHASE must be 1b, 8b or all, got $PHASE"; exit 2; }
GRID8B=${GRID8B-"--pp 4"}
NPROC8B=${NPROC8B:-4}
COMMON="--model llama --seed 0 --lr 3e-4 --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 $AMP"

run() {  # name nproc limit_s driver-args...
  local name=$1 n=$2 limit=$3; shift 3
  budget_run "$name" "$limit" $PY -m hybrid_engine.launch --nproc_per_node="$n" hybrid_engine.py --quiet \
      --metrics "$RES/$name.jsonl" $COMMON "$@" \
    && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}

if [[ $PHASE != 8b ]]; then
  run llama1b_fused_off 1 150 $SHAPE1B $RUN1B --fused-kernels off
  run llama1b_fused_on 1 200 $SHAPE1B $RUN1B --fused-kernels on
fi
if [[ $PHASE != 1b ]]; then
  if ((NPROC8B > GPUS_SEEN)); then
    echo "8B: $NPROC8B processes asked, $GPUS_SEEN GPUs seen: skipped (set GRID8B and NPROC8B)"
  else
    run llama8b_bf16 "$NPROC8B" 200 $SHAPE8B $RUN8B $GRID8B --fused-kernels on
    run llama8b_fp8_tensorwise "$NPROC8B" 200 $SHAPE8B $RUN8B $GRID8B --fused-kernels on --fp8
    run llama8b_fp8_rowwise "$NPROC8B" 200 $SHAPE8B $RUN8B $GRID8B --fused-kernels on --fp8 --fp8-recipe rowwise
  fi
fi

SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$($PY -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-${GPUS_SEEN}x${SHORT:-$CARD}-kernels.json"
$PY experiments/analysis/kernels_results.py "$RES" "$RESULT" --card "$CARD" --torch "$TORCH" \
    --shape-1b "$SHAPE1B $RUN1B" --shape-8b "$SHAPE8B $RUN8B $GRID8B" | tee "$RES/results.txt"
tar czf "$OUT/kernels.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/kernels.tgz after ${SECONDS}s"
