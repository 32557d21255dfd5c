#!/usr/bin/env bash
# One device call on 4 GPUs (~1.5 min): config L fp16, the base code at its original setting (2 processes, each
# driving 2 GPUs: dp=2 x 2 pipeline halves) against the engine's dp=2 x pp=2 on the same GPUs (zb1 + merged W +
# lookahead 1, and 1F1B), all in one job. Logs land in ${OUT:-/tmp/he_out}/four_gpu_pass.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup four_gpu_pass
L="--dim 8192 --depth 16 --batch-size 1024 --steps 8 --warmup 3 --seed 0 --amp fp16"
program base_dp2 2 baseline_practical10.py $L --micro-batches 8
engine engine_dp2pp2 4 --dp 2 --pp 2 $L --micro-batches 4 --schedule zb1 --merge-wgrad --lookahead 1
engine engine_dp2pp2_1f1b 4 --dp 2 --pp 2 $L --micro-batches 4 --schedule 1f1b
tar czf "$OUT/four_gpu_pass.tgz" -C "$RES" .
