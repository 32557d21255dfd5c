#!/usr/bin/env bash
# One device call (~5 min, 2 GPUs): data parallelism at config L fp16, each dp=2 run beside the 1-GPU run of the
# same flags in the same job: the default schedule (1F1B at pp=1: each micro-batch's weight gradients
# accumulated in its backward) and zb1 + merged W, each with the fp32 all-reduce and with bf16 on the wire
# (--dp-grad-dtype bf16); strong scaling (L's batch, 4 micro-batches per replica) and weak (twice L's batch,
# L's 8 micro-batches per replica). Logs land in ${OUT:-/tmp/he_out}/dp_pass.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup dp_pass
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0 --amp fp16"
Lw="--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0 --amp fp16"
ZB="--schedule zb1 --merge-wgrad"
engine L_single 1 $L
engine L_dp2 2 --dp 2 $L --micro-batches 4
engine L_dp2_bf16wire 2 --dp 2 $L --micro-batches 4 --dp-grad-dtype bf16
engine Lw_dp2 2 --dp 2 $Lw
engine Lw_dp2_bf16wire 2 --dp 2 $Lw --dp-grad-dtype bf16
engine L_single_zb1m 1 $L $ZB
engine L_dp2_zb1m 2 --dp 2 $L --micro-batches 4 $ZB
engine L_dp2_zb1m_bf16wire 2 --dp 2 $L --micro-batches 4 $ZB --dp-grad-dtype bf16
engine Lw_dp2_zb1m 2 --dp 2 $Lw $ZB
engine Lw_dp2_zb1m_bf16wire 2 --dp 2 $Lw $ZB --dp-grad-dtype bf16
tar czf "$OUT/dp_pass.tgz" -C "$RES" .
