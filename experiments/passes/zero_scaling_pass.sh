#!/usr/bin/env bash
# One device call (~3 min, 2 GPUs): the 1-GPU side of experiments/passes/zero_overlap_pass.sh's config L runs (the same
# flags at dp=1: strong scaling divides by these) and the weak-scaling runs (dp=2 at twice the batch), with
# --zero 1 and the all-gather overlapped, under 1F1B and zb1 + merged W. Then a torch.profiler of the GPT at tp=2
# with --sequence-parallel (experiments/bench/profile_gpt.py), to see where its step goes. Logs in
# ${OUT:-/tmp/he_out}/zero_scaling_pass.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup zero_scaling_pass
L="--dim 8192 --depth 16 --micro-batches 4 --steps 10 --warmup 4 --seed 0 --amp fp16"
ZB="--schedule zb1 --merge-wgrad"
for sched in 1f1b zb1m; do
  S=""; [ "$sched" = zb1m ] && S="$ZB"
  engine "L_dp1_$sched" 1 $L $S --batch-size 1024
  engine "L_dp2_zero_$sched" 2 $L $S --batch-size 1024 --dp 2 --zero 1
  engine "L_dp2_zero_weak_$sched" 2 $L $S --batch-size 2048 --dp 2 --zero 1
  engine "L_dp2_weak_$sched" 2 $L $S --batch-size 2048 --dp 2
done
gpt_tokens
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --amp bf16"
G="$G --optimizer adamw --lr 3e-4 --seed 0 --batch-size 16 --micro-batches 8 --mp 2"
timeout 200 torchrun --nproc_per_node=2 experiments/bench/profile_gpt.py $G --sequence-parallel --steps 6 \
  > "$RES/profile_tp2_sp.txt" 2>&1; grep -v "^\s*$" "$RES/profile_tp2_sp.txt" | grep -v "^---" | head -40 | cut -c1-230
rm -f "$OUT"/profile_gpt_rank*.json
tar czf "$OUT/zero_scaling_pass.tgz" -C "$RES" .
