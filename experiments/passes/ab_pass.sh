#!/usr/bin/env bash
# One device call (~7 min, 2 GPUs) after the native-stage and fused-unscale changes: the GPU unit tests, then
# each issue-#6 target's two sides in one job (engine beside base and peer), the engine's native stages
# against the autograd stages they replace (job 5 ran --autograd-stages, the fused chain as one autograd node, which
# is gone; --stage-impl autograd now runs stages module by module through autograd: the A/B), data parallelism (1 GPU, dp=2 strong
# and weak), L in bf16 with mp=2 against DTensor TP, and traced 1F1B runs of L and X (the measured bubble).
# Logs, metrics and traces land in ${OUT:-/tmp/he_out}/ab_pass.tgz; experiments/analysis/pass_results.py ab turns them
# into a results file.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup ab_pass
timeout 150 python3 -X faulthandler -m pytest -q -x tests/optim/test_fused_sgd.py tests/optim/test_nonfinite_flag.py \
  > "$RES/pytest_gpu.txt" 2>&1
echo "gpu pytest rc=$? $(tail -1 "$RES/pytest_gpu.txt")"
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 8 --warmup 3 --seed 0"
C="--dim 8192 --depth 8 --batch-size 64 --micro-batches 4 --steps 10 --warmup 3 --seed 0"
Lw="--dim 8192 --depth 16 --batch-size 2048 --micro-batches 8 --steps 8 --warmup 3 --seed 0"
X="--dim 8192 --depth 16 --batch-size 16384 --micro-batches 8 --steps 4 --warmup 1 --seed 0"
BEST="--schedule zb1 --merge-wgrad --lookahead 1"
engine C_fp16_zb1m 2 --pp 2 $C --amp fp16 $BEST
engine C_fp16_zb1m_autograd 2 --pp 2 $C --amp fp16 $BEST --stage-impl autograd
program C_fp16_peer 2 peer_torch_pipelining.py --mode 1f1b $C --amp fp16
program C_fp16_base 1 baseline_practical10.py $C --amp fp16
engine L_fp16_zb1m 2 --pp 2 $L --amp fp16 $BEST
engine L_fp16_zb1m_autograd 2 --pp 2 $L --amp fp16 $BEST --stage-impl autograd
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
