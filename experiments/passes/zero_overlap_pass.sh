#!/usr/bin/env bash
# One device call (~7 min, 2 GPUs): ZeRO-1's parameter all-gather overlapped with the next forward (issue #18) and
# the trace of a dp=2 step with its DP collectives (issue #21). In one job, at dp=2: config L fp16 (native stages,
# 16 buckets of one layer each) under 1F1B and zb1 + merged W, and the GPT-1B shape of gpt_dp_pass.sh (autograd
# stages: the per-layer forward pre-hooks), each as the replicated optimizer, --zero 1 with the all-gather exposed
# (--no-overlap-param-gather: the behaviour before the overlap) and --zero 1 overlapped (the default). The timed
# runs carry no --trace; then one traced run per shape writes trace_*.json/png (the Chrome trace's process 1 holds
# each bucket's reduce-scatter and all-gather beside the compute actions). Compare the median steps of
# *_zero_exposed_* and *_zero_* (and experiments/results/2026-11-26-2xH200-zero.json, whose L_dp2_zero_* ran the
# exposed path). Logs and traces in ${OUT:-/tmp/he_out}/zero_overlap_pass.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup zero_overlap_pass
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 4 --steps 10 --warmup 4 --seed 0 --amp fp16 --dp 2"
ZB="--schedule zb1 --merge-wgrad"
for sched in 1f1b zb1m; do
  S=""; [ "$sched" = zb1m ] && S="$ZB"
  engine "L_dp2_$sched" 2 $L $S
  engine "L_dp2_zero_exposed_$sched" 2 $L $S --zero 1 --no-overlap-param-gather
  engine "L_dp2_zero_$sched" 2 $L $S --zero 1
done
engine trace_L_dp2_zero_1f1b 2 $L --zero 1 --steps 4 --warmup 1 --trace "$RES/trace_L_dp2_zero_1f1b"
engine trace_L_dp2_zero_exposed_1f1b 2 $L --zero 1 --no-overlap-param-gather --steps 4 --warmup 1 \
  --trace "$RES/trace_L_dp2_zero_exposed_1f1b"
gpt_tokens
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --amp bf16"
G="$G --optimizer adamw --lr 3e-4 --steps 6 --warmup 2 --seed 0 --dp 2 --batch-size 16 --micro-batches 4"
engine gpt_dp2_zero_exposed 2 $G --zero 1 --no-overlap-param-gather
engine gpt_dp2_zero 2 $G --zero 1
engine trace_gpt_dp2_zero 2 $G --zero 1 --steps 3 --warmup 1 --trace "$RES/trace_gpt_dp2_zero"
last_losses
grep -h "^trace:" "$RES"/trace_*.log
tar czf "$OUT/zero_overlap_pass.tgz" -C "$RES" .
