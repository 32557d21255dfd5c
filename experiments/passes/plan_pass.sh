#!/usr/bin/env bash
# The planner's pass: the auto plan (no --schedule, no --micro-batches) beside a small hand-tuned sweep, in one job
# per phase (one device call each, under PASS_BUDGET_S, default 540 s):
#
#   PHASE=one   one GPU: MLP configs L (dim 8192, depth 16, batch 1024) and C (dim 8192, depth 8, batch 64), fp16;
#               the GPT-1B shape (hidden 2048, 16 layers, 16 heads, seq 2048, vocabulary 32000, 16 sequences, bf16).
#               Each: auto, then 1f1b and zb1 + merged W at 1, 4 and 8 micro-batches (~8 min on one H100/H200).
#   PHASE=four  four GPUs, pp4: the same three with auto, 1f1b, zb1 + merged W (+ lookahead 1) and interleaved
#               (v2), at 4 and 8 micro-batches (~9 min on 4 x H100/H200).
#
# Every run writes --metrics, whose last line holds the summary record (measured and predicted step time and peak
# memory); experiments/analysis/plan_results.py writes the auto plan's ratio to the best hand-tuned run of each
# model and predicted against measured for every run. DEVICE_SO: a prebuilt _C of the same tree, copied in place.
# Out: ${OUT:-/tmp/he_out}/plan_<phase>.tgz and <date>-<n>x<card>-plan-<phase>.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PHASE=${PHASE:-one}
pass_start plan_$PHASE
gpt_tokens

run() {  # name gpus driver-args...: one run, its metrics and log under $RES
  local name=$1 n=$2; shift 2
  budget_run "$name" 150 torchrun --nproc_per_node="$n" hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" "$@" \
    && echo "$name: $(grep -o 'median step [0-9.]* ms' "$RES/$name.log"); $(grep -o 'step [0-9.]* ms (predicted.*' \
       "$RES/$name.log")"
}

L="--dim 8192 --depth 16 --batch-size 1024 --steps 10 --warmup 4 --seed 0 --amp fp16"
C="--dim 8192 --depth 8 --batch-size 64 --steps 12 --warmup 4 --seed 0 --amp fp16"
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin \
   --batch-size 16 --steps 8 --warmup 3 --seed 0 --amp bf16"
ZB="--schedule zb1 --merge-wgrad"
# Each model's auto run first, then the sweep from the plans most likely to be best, so a budget cut leaves the
# comparisons that matter.
if [[ $PHASE == one ]]; then
  for cfg in L C G; do run ${cfg}_auto 1 ${!cfg}; done      # the planner's choice, printed as "plan: ..."
  for m in 1 8 4; do
    for cfg in L C G; do
      F=${!cfg}
      run ${cfg}_1f1b_m$m 1 $F --schedule 1f1b --micro-batches $m
      [[ $cfg == G ]] || run ${cfg}_zb1merged_m$m 1 $F $ZB --micro-batches $m
    done
  done
  run G_zb1merged_m4 1 $G $ZB --micro-batches 4   # doubles memory for no speed, to show it
  GPUS=1
else
  for cfg in L C G; do run ${cfg}_pp4_auto 4 ${!cfg} --pp 4; done
  run G_dp4_auto 4 $G --dp 4                      # the grid the plan command ranks first for the GPT
  for m in 8 4; do
    for cfg in L C G; do
      F="${!cfg} --pp 4"
      run ${cfg}_pp4_zb1merged_m$m 4 $F $ZB --micro-batches $m --lookahead 1
      run ${cfg}_pp4_interleaved_m$m 4 $F --schedule interleaved --virtual-stages 2 --micro-batches $m
      run ${cfg}_pp4_1f1b_m$m 4 $F --schedule 1f1b --micro-batches $m
    done
  done
  GPUS=4
fi

CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
RESULT="$OUT/$(date +%F)-${GPUS}x${SHORT:-gpu}-plan-$PHASE.json"
python3 experiments/analysis/plan_results.py "$RES" "$RESULT" --card "$CARD" | tee "$RES/results.txt"
tar czf "$OUT/plan_$PHASE.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/plan_$PHASE.tgz after ${SECONDS}s"
