#!/usr/bin/env bash
# Where a short context-parallel step goes: cp4 at 16k tokens (4k a rank), the ring against the all-gather, one
# device call on 4 GPUs under PASS_BUDGET_S (default 240 s; DEVICE_SO skips the build as in pass_lib.sh).
#
# The long-sequence pass timed these runs over 3 steps after 2 warm-up ones, and the ring's three were 182, 155 and
# 185 ms: first both again over 10 steps after 5 (cp4_16k_ring, cp4_16k_gather), then both under
# experiments/bench/profile_driver.py recording steps 6-10 only (PROFILE_STEPS=5:5: no compiling or communicator
# set-up in the files), rank 0's two files side by side (compare_profiles.py) in compare_16k.txt, every rank's file
# in $OUT/cp_short.tgz, the step times and each rank's profiled step in one JSON
# ($OUT/<date>-4x<card>-cp4-16k-ring-gather.json, experiments/analysis/cp_short_results.py). The model and flags are the long-sequence pass's (experiments/passes/long_seq_pass.sh).
#
#   DEVICE_SO=/tmp/he_so/*.so bash experiments/passes/cp_short_pass.sh    # after long_seq_pass.sh on a warm machine
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PASS_BUDGET_S=${PASS_BUDGET_S:-240} pass_start cp_short
SHAPE="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632"
write_tokens /tmp/long_seq_tokens.bin 32000 4000000
RUN="--data /tmp/long_seq_tokens.bin --batch-size 1 --micro-batches 1 --schedule 1f1b --lookahead 0 --virtual-stages 1"
RUN="$RUN --no-merge-wgrad --warmup 5 --seed 0 --rope-theta 500000 --max-positions 131072"
L="--model llama $SHAPE $RUN --optimizer adamw --lr 3e-4 --weight-decay 0.1 --betas 0.9,0.95 --amp bf16"
L="$L --seq-len 16384 --cp 4"
for comm in ring all-gather; do
  name=cp4_16k_${comm%-*}
  budget_run "$name" 90 torchrun --nproc_per_node=4 hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" $L \
      --cp-comm "$comm" --steps 15 && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
done
for comm in ring all-gather; do
  name=profile_16k_${comm%-*}
  PROFILE_OUT="$RES/$name" PROFILE_STEPS=5:5 budget_run "$name" 100 torchrun --nproc_per_node=4 \
      experiments/bench/profile_driver.py --quiet $L --cp-comm "$comm" --steps 10 \
      && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
done
[[ -f $RES/profile_16k_ring-rank0.json && -f $RES/profile_16k_all-rank0.json ]] \
  && python3 experiments/bench/compare_profiles.py "$RES/profile_16k_ring-rank0.json" \
       "$RES/profile_16k_all-rank0.json" 45 | tee "$RES/compare_16k.txt"
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
python3 experiments/analysis/cp_short_results.py "$RES" "$OUT/$(date +%F)-4x$(grep -o 'H[0-9]00' <<< "$CARD" \
    | head -1)-cp4-16k-ring-gather.json" --card "$CARD" > /dev/null
tar czf "$OUT/cp_short.tgz" -C "$RES" .
echo "cp_short: done after ${SECONDS}s"
