#!/usr/bin/env bash
# One device call (~5 min, 2 GPUs) that decides the settings of the final measurement: the GPU unit tests,
# then configs L and C in fp16 over --lookahead 0..3 (zb1 + merged W), base and peer beside them, and data
# parallelism with the overlapped all-reduce (1 GPU, dp=2 at L's batch, dp=2 at twice L's batch).
# Logs and metrics land in ${OUT:-/tmp/he_out}/tune_pass.tgz; the table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup tune_pass
timeout 120 python3 -X faulthandler -m pytest -q -x tests/optim/test_fused_sgd.py > "$RES/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$?"; tail -25 "$RES/pytest_gpu.txt"
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0"
C="--dim 8192 --depth 8 --batch-size 64 --micro-batches 4 --steps 10 --warmup 3 --seed 0"
Lw="--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0"
for k in 0 1 2; do engine "L_fp16_zb1m_ahead$k" 2 --pp 2 $L --amp fp16 --schedule zb1 --merge-wgrad --lookahead $k; done
engine L_fp16_1f1b_ahead1 2 --pp 2 $L --amp fp16 --schedule 1f1b --lookahead 1
program L_fp16_peer 2 peer_torch_pipelining.py --mode 1f1b $L --amp fp16
program L_fp16_base 1 baseline_practical10.py $L --amp fp16
for k in 0 1 2 3; do engine "C_fp16_zb1m_ahead$k" 2 --pp 2 $C --amp fp16 --schedule zb1 --merge-wgrad --lookahead $k; done
program C_fp16_peer 2 peer_torch_pipelining.py --mode 1f1b $C --amp fp16
program C_fp16_base 1 baseline_practical10.py $C --amp fp16
engine L_fp16_single 1 $L --amp fp16
engine L_fp16_dp2 2 --dp 2 $L --amp fp16
engine Lw_fp16_dp2 2 --dp 2 $Lw --amp fp16
tar czf "$OUT/tune_pass.tgz" -C "$RES" .
