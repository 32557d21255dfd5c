#!/usr/bin/env bash
# One device call (~7 min, 2 GPUs): the distributed optimizer (--zero 1) beside the replicated one at config L
# fp16, each dp=2 run beside the 1-GPU run of the same flags in the same job, under the default schedule (1F1B at
# pp=1) and zb1 + merged W: the 1-GPU cost of the --zero 1 path (dp=1), strong scaling (L's batch, 4
# micro-batches per replica) and weak (twice L's batch, L's 8 micro-batches per replica). Then the GPU unit tests
# of the CUDA paths. Logs land in ${OUT:-/tmp/he_out}/zero_pass.tgz; experiments/analysis/pass_results.py-style numbers
# are printed as one line per run (median step).
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup zero_pass
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 10 --warmup 4 --seed 0 --amp fp16"
Lw="--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 10 --warmup 4 --seed 0 --amp fp16"
ZB="--schedule zb1 --merge-wgrad"
for sched in 1f1b zb1m; do
  S=""; [ "$sched" = zb1m ] && S="$ZB"
  engine "L_single_$sched" 1 $L $S
  engine "L_single_zero_$sched" 1 $L $S --zero 1
  engine "L_dp2_$sched" 2 --dp 2 $L --micro-batches 4 $S
  engine "L_dp2_zero_$sched" 2 --dp 2 $L --micro-batches 4 $S --zero 1
  engine "Lw_dp2_$sched" 2 --dp 2 $Lw $S
  engine "Lw_dp2_zero_$sched" 2 --dp 2 $Lw $S --zero 1
done
last_losses  # sharded and replicated must agree
timeout 300 python3 -m pytest -q tests/optim/test_fused_sgd.py tests/optim/test_nonfinite_flag.py 2>&1 | tail -3
tar czf "$OUT/zero_pass.tgz" -C "$RES" .
