#!/usr/bin/env bash
# One device call on 4 GPUs (~9 min): the GPT of the 4-GPU grids pass (hidden 2560, 12 layers, 20 heads, seq 1024,
# vocabulary 32000, 32 sequences in 8 micro-batches, AdamW, bf16) at pp=4 under every pipeline schedule:
#   engine  zbv, dualpipev, 1f1b, zb1 + merged W, zbv + merged W, interleaved (v2, v3), the planner's own choice
#           (no schedule flags), and zbv / dualpipev / 1f1b with --compile (its stages under torch.compile); each
#           under the default --cuda-graphs auto (the stages may replay as graphs: the log's line says) and
#           --split-blocks auto (stages may end inside a block), zbv with --cuda-graphs off beside it, and zbv and
#           interleaved with --split-blocks off (whole blocks)
#   torch   torch.distributed.pipelining ZBV, DualPipeV, 1F1B and interleaved 1F1B with each block compiled
#           (experiments/peers/torch_pp_peer.py), and ZBV, DualPipeV and 1F1B eager
# Runs go in that priority order, interleaved engine / torch, under one time budget (PASS_BUDGET_S, default 520 s): a
# run that no longer fits is skipped and said, so the results file is always written. ONLY="name ..." runs only
# the named runs (e.g. ONLY="engine_pp4_zbv torch_pp4_zbv_compile").
# Out: ${OUT:-/tmp/he_out}/<date>-4x<card>-pp4-schedules.json (experiments/analysis/pp4_schedules_results.py: every
# run, the engine's best over torch's best, each run's losses against the engine's 1f1b) and pp4_schedules.tgz.
#
# SMOKE=1 runs the same list on the CPU (gloo, 4 processes) at a tiny shape for 3 steps, without the build, the
# GPUs or the compiled runs (SMOKE_COMPILE=1 keeps them): a check of the commands and the results file.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
if [[ ${SMOKE:-0} == 1 ]]; then
  DEADLINE=$((SECONDS + ${PASS_BUDGET_S:-900})); RESERVE=5
  OUT=${OUT:-/tmp/he_out}; RES=/tmp/pp4_schedules_smoke; mkdir -p "$OUT" "$RES"
  export CUDA_VISIBLE_DEVICES="" GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
  PYTHON=${PYTHON:-python3}
  TOKENS=$RES/tokens.bin
  SHAPE="--hidden 32 --layers 6 --heads 4 --seq-len 16 --data $TOKENS --batch-size 8 --micro-batches 8"
  SHAPE="$SHAPE --steps 3 --warmup 1 --seed 0"
  G="--model gpt $SHAPE --optimizer adamw --lr 3e-4 --clip-grad 0 --device cpu"
  P="$SHAPE --lr 3e-4 --precision fp32 --device cpu"
  VOCAB=512
else
  pass_start pp4_schedules
  PYTHON=python3
  TOKENS=/tmp/gpt_grid_tokens.bin
  SHAPE="--hidden 2560 --layers 12 --heads 20 --seq-len 1024 --data $TOKENS --batch-size 32 --micro-batches 8"
  SHAPE="$SHAPE --steps 8 --warmup 3 --seed 0"
  G="--model gpt $SHAPE --optimizer adamw --lr 3e-4 --clip-grad 0 --amp bf16"
  P="$SHAPE --lr 3e-4 --precision bf16"
  VOCAB=32000
fi
rm -f "$RES"/*.log "$RES"/*.jsonl "$RES"/*.cmd "$RES"/*.rc "$RES/skipped.txt"
write_tokens "$TOKENS" "$VOCAB" 8000000

wanted() {  # name: in ONLY (or no ONLY), and not a compiled run of a smoke without SMOKE_COMPILE
  [[ -z ${ONLY:-} || " $ONLY " == *" $1 "* ]] || return 1
  [[ ${SMOKE:-0} == 1 && ${SMOKE_COMPILE:-0} != 1 && $1 == *compile* ]] && return 1
  return 0
}
engine() {  # name driver-args...: the driver on 4 ranks with --metrics
  local name=$1; shift
  wanted "$name" || return 0
  budget_run "$name" 150 "$PYTHON" -m torch.distributed.run --nproc_per_node=4 --master_port=$((29500 + RANDOM % 500)) \
      hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" $G --pp 4 "$@" \
    && echo "$name: $(grep -o 'summary.*' "$RES/$name.log" | cut -c1-160)"
}
peer() {  # name mode schedule [limit]: experiments/peers/gpt_pp_tp_peers.py on 4 ranks, its JSON line kept
  wanted "$1" || return 0
  budget_run "$1" "${4:-150}" "$PYTHON" -m torch.distributed.run --nproc_per_node=4 \
      --master_port=$((29500 + RANDOM % 500)) experiments/peers/gpt_pp_tp_peers.py --mode "$2" --pp-schedule "$3" $P \
    && echo "$1: $(grep '^{' "$RES/$1.log" | tail -1 | grep -o '"tokens_s": [0-9.]*')"
}

engine engine_pp4_zbv --schedule zbv
engine engine_pp4_zbv_whole --schedule zbv --split-blocks off
engine engine_pp4_zbv_eager --schedule zbv --cuda-graphs off
peer torch_pp4_zbv_compile torch-pp-compile zbv 240
engine engine_pp4_dualpipev --schedule dualpipev
peer torch_pp4_dualpipev_compile torch-pp-compile dualpipev 240
engine engine_pp4_1f1b --schedule 1f1b
peer torch_pp4_1f1b_compile torch-pp-compile 1f1b 240
engine engine_pp4_zb1m --schedule zb1 --merge-wgrad
engine engine_pp4_zbvm --schedule zbv --merge-wgrad
peer torch_pp4_interleaved_compile torch-pp-compile interleaved 240
engine engine_pp4_interleaved --schedule interleaved --virtual-stages 2
engine engine_pp4_interleaved_whole --schedule interleaved --virtual-stages 2 --split-blocks off
engine engine_pp4_interleaved_v3 --schedule interleaved --virtual-stages 3
engine engine_pp4_auto
engine engine_pp4_zbv_compile --schedule zbv --compile
peer torch_pp4_zbv torch-pp zbv
engine engine_pp4_dualpipev_compile --schedule dualpipev --compile
peer torch_pp4_dualpipev torch-pp dualpipev
engine engine_pp4_1f1b_compile --schedule 1f1b --compile
peer torch_pp4_1f1b torch-pp 1f1b

if [[ ${SMOKE:-0} == 1 ]]; then
  CARD="cpu (smoke)"; SHORT=cpu
else
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
fi
TORCH=$("$PYTHON" -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-4x${SHORT:-gpu}-pp4-schedules.json"
"$PYTHON" experiments/analysis/pp4_schedules_results.py "$RES" "$RESULT" --card "4 x $CARD, torch $TORCH" \
    --shape "GPT $SHAPE, AdamW lr 3e-4, no clipping; the engine's draw of every step" | tee "$RES/results.txt"
tar czf "$OUT/pp4_schedules.tgz" -C "$RES" --exclude tokens.bin .
echo "wrote $RESULT and $OUT/pp4_schedules.tgz after ${SECONDS}s"
