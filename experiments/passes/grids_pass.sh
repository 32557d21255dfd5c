#!/usr/bin/env bash
# The 4-GPU pass: every 4-rank grid (dp x pp x mp = 4x1x1, 1x4x1, 1x1x4, 2x2x1, 2x1x2, 1x2x2), each beside one GPU
# running the same flags, in one job per phase (one device call each, ~9 min on 4 x H100):
#
#   PHASE=mlp  configs L (dim 8192, depth 16, batch 1024) and C (dim 8192, depth 8, batch 64), fp16, each grid with
#              its best flags; mp=2 alone (2 GPUs); the tensor-parallel chain's row chunks (auto, 1, 2) and the
#              module path (--stage-impl autograd) for L; dp4 with bf16 gradients on the wire; the Practical-10
#              base code at its 4-GPU setting (2 processes x 2 GPUs).
#   PHASE=gpt  the GPT shape of the 4 x H200 anchors (hidden 2560, 20 heads, 12 layers, seq 1024, vocabulary
#              32000, 32 sequences in 8 micro-batches, AdamW, bf16) on one GPU and the six grids, then its peers:
#              Megatron-core 0.16.1 (local spec; pp2 x tp2, pp4, tp4), torch pipelining pp4 (eager and compiled),
#              DTensor tp4. Megatron comes from its cp312 wheel, carried in .whl/.
#
# Runs go in priority order under one budget (PASS_BUDGET_S, default 540 s): a run that no longer fits is skipped
# and said. Every engine run writes --metrics; experiments/analysis/grids_results.py turns the logs into the results
# file (median step after the warm-up, samples or tokens/s, MFU, each grid against its 1-GPU run and its peer).
# DEVICE_SO: a prebuilt _C of the same tree (an earlier call's, left in /tmp/he_so on a warm machine or carried
# from its $OUT), copied in place instead of building.
# Out: ${OUT:-/tmp/he_out}/grids_<phase>.tgz (logs, metrics, commands) and <date>-4x<card>-grids-<phase>.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PHASE=${PHASE:-mlp}
pass_start grids_$PHASE

engine() {  # name gpus driver-args...: one GPU runs on GPU 0
  local name=$1 n=$2; shift 2
  budget_run "$name" 150 torchrun --nproc_per_node="$n" hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" "$@" \
    && echo "$name: $(grep -o 'median step [0-9.]* ms' "$RES/$name.log")"
}
program() {  # name gpus limit script args...: a base or peer program, its JSON line kept
  local name=$1 n=$2 limit=$3 script=$4; shift 4
  budget_run "$name" "$limit" torchrun --nproc_per_node="$n" "experiments/peers/$script" "$@" \
    && echo "$name: $(grep '^{' "$RES/$name.log" | tail -1 | grep -o '"\(samples\|tokens\)_s": [0-9.]*')"
}

if [[ $PHASE == mlp ]]; then
  L="--dim 8192 --depth 16 --batch-size 1024 --steps 10 --warmup 4 --seed 0 --amp fp16"
  C="--dim 8192 --depth 8 --batch-size 64 --steps 12 --warmup 4 --seed 0 --amp fp16"
  ZB="--schedule zb1 --merge-wgrad"
  M1="--schedule 1f1b --micro-batches 1"  # one micro-batch: the backward overwrites the gradients, and each
                                         # weight-gradient GEMM runs under the MP all-reduce of its input gradient
  for cfg in L C; do
    F=${!cfg}
    engine ${cfg}_1gpu_m1 1 $F $M1
    engine ${cfg}_mp2 2 --mp 2 $F $M1
    engine ${cfg}_mp4 4 --mp 4 $F $M1
    engine ${cfg}_dp2mp2 4 --dp 2 --mp 2 $F $M1
    engine ${cfg}_dp4 4 --dp 4 --zero 1 $F $M1
    engine ${cfg}_1gpu_m4 1 $F $ZB --micro-batches 4 --lookahead 1
    engine ${cfg}_pp2mp2 4 --pp 2 --mp 2 $F $ZB --micro-batches 4 --lookahead 1
    engine ${cfg}_dp2pp2 4 --dp 2 --pp 2 $F $ZB --micro-batches 4 --lookahead 1
    engine ${cfg}_1gpu_m8 1 $F $ZB --micro-batches 8 --lookahead 1
    engine ${cfg}_pp4 4 --pp 4 $F $ZB --micro-batches 8 --lookahead 1
  done
  engine L_dp2mp2_trace 4 --dp 2 --mp 2 $L $M1 --trace "$RES/L_dp2mp2_trace"
  program L_base 2 120 baseline_practical10.py $L --micro-batches 8
  engine L_mp2_zb1m 2 --mp 2 $L $ZB --micro-batches 1
  engine L_dp4_bf16grads 4 --dp 4 --zero 1 --dp-grad-dtype bf16 $L $M1
  engine L_mp2_chunks2 2 --mp 2 $L $M1 --tp-chunks 2
  NCCL_MAX_CTAS=8 engine L_mp2_chunks2_ctas8 2 --mp 2 $L $M1 --tp-chunks 2
else
  write_tokens /tmp/gpt_grid_tokens.bin 32000 8000000
  if ls .whl/megatron_core-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/mcore .whl/megatron_core-*.whl > "$RES/mcore.log" 2>&1
  fi
  SHAPE="--hidden 2560 --layers 12 --heads 20 --seq-len 1024 --data /tmp/gpt_grid_tokens.bin --batch-size 32"
  SHAPE="$SHAPE --micro-batches 8 --steps 8 --warmup 3 --seed 0"
  G="--model gpt $SHAPE --optimizer adamw --lr 3e-4 --amp bf16"
  P="$SHAPE --lr 3e-4 --precision bf16"
  engine gpt_1gpu 1 $G
  engine gpt_dp2pp2 4 --dp 2 --pp 2 $G
  engine gpt_pp2tp2 4 --pp 2 --mp 2 $G
  engine gpt_tp4 4 --mp 4 $G
  engine gpt_pp4 4 --pp 4 $G
  engine gpt_dp4 4 --dp 4 --zero 1 $G
  engine gpt_dp2tp2 4 --dp 2 --mp 2 $G
  MCORE="/tmp/mcore:${PYTHONPATH:-}"
  PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 program megatron_pp2tp2 4 150 gpt_pp_tp_peers.py --mode megatron-pp-tp $P
  PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 program megatron_pp4 4 150 gpt_pp_tp_peers.py --mode megatron-pp $P
  PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 program megatron_tp4 4 150 gpt_pp_tp_peers.py --mode megatron-tp $P
  program torch_pp4 4 150 gpt_pp_tp_peers.py --mode torch-pp $P
  program torch_pp4_compile 4 240 gpt_pp_tp_peers.py --mode torch-pp-compile $P
  program dtensor_tp4 4 150 gpt_pp_tp_peers.py --mode dtensor-tp $P
  engine gpt_tp4_sp 4 --mp 4 $G --sequence-parallel
  engine gpt_tp4_m2 4 --mp 4 $G --micro-batches 2
  engine gpt_pp4_interleaved 4 --pp 4 $G --schedule interleaved --virtual-stages 3
fi

CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$(python3 -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-4x${SHORT:-gpu}-grids-$PHASE.json"
python3 experiments/analysis/grids_results.py "$RES" "$RESULT" --phase "$PHASE" --card "$CARD" --torch "$TORCH" \
    | tee "$RES/results.txt"
tar czf "$OUT/grids_$PHASE.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/grids_$PHASE.tgz after ${SECONDS}s"
