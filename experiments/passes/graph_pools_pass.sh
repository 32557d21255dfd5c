#!/usr/bin/env bash
# What CUDA-graphed runs hold in each memory pool (the planner's graphed memory, planner/graph_pools.py), one device
# call: each run under experiments/bench/graph_pools_probe.py, --cuda-graphs on, 4 steps (the captures come at the
# second). GPUS=2: the Llama-1B class on one GPU, tp2 and pp2, the GPT (hidden 2560, 12 layers, seq 1024, 8
# micro-batches of 4) at pp2 under 1f1b and interleaved v2 and v3; GPUS=4: the Llama at tp4, pp4 and pp2 x tp2, the
# GPT at pp4 under the same three schedules. RUNS="llama_tp4 ..." runs only those; PROBE_STACKS=1 writes the general
# pool's blocks by allocation site instead (C++ frames too). Out: $OUT/graph-pools.tgz (the per-rank JSONs and logs;
# results/<date>-<n>xH200-graph-pools.json is their summary).
#
#   GPUS=4 bash experiments/passes/graph_pools_pass.sh        # device kind nvidia-h200-x4
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
GPUS=${GPUS:-4}
PASS_BUDGET_S=${PASS_BUDGET_S:-560} pass_start graph_pools
export PYTHONUNBUFFERED=1
[[ ${PROBE_STACKS:-0} == 1 ]] && export TORCH_SYMBOLIZE_MODE=dladdr
write_tokens /tmp/graph_pools_tokens.bin 32000 8000000
LLAMA="--model llama --seed 0 --lr 3e-4 --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 --amp bf16 --zero 0 \
--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048 --vocab-size 32000 \
--batch-size 16 --micro-batches 8 --schedule 1f1b"
GPT="--model gpt --hidden 2560 --layers 12 --heads 20 --seq-len 1024 --data /tmp/graph_pools_tokens.bin \
--batch-size 32 --micro-batches 8 --seed 0 --optimizer adamw --lr 3e-4 --clip-grad 0 --amp bf16 --split-blocks off"

probe() {  # name nproc limit_s driver-args...
  local name=$1 n=$2 limit=$3; shift 3
  [[ -z "${RUNS:-}" || " $RUNS " == *" $name "* ]] || return 0
  PROBE_OUT=$RES/$name budget_run "$name" "$limit" torchrun --nproc_per_node="$n" \
      --master_port=$((29500 + RANDOM % 500)) experiments/bench/graph_pools_probe.py --quiet --steps 4 --warmup 1 \
      --cuda-graphs on "$@" \
    && echo "$name: $(grep -o 'summary.*' "$RES/$name.log" | cut -c1-200)"
  tar czf "$OUT/graph-pools.tgz" -C /tmp graph_pools
}

if [[ $GPUS == 2 ]]; then
  probe llama_1gpu 1 150 $LLAMA
  probe llama_tp2 2 150 $LLAMA --mp 2
  probe llama_pp2 2 150 $LLAMA --pp 2
  probe gpt_pp2_1f1b 2 120 $GPT --pp 2 --schedule 1f1b
  probe gpt_pp2_v2 2 120 $GPT --pp 2 --schedule interleaved --virtual-stages 2
  probe gpt_pp2_v3 2 120 $GPT --pp 2 --schedule interleaved --virtual-stages 3
else
  probe llama_tp4 4 150 $LLAMA --mp 4
  probe gpt_v2 4 120 $GPT --pp 4 --schedule interleaved --virtual-stages 2
  probe gpt_1f1b 4 120 $GPT --pp 4 --schedule 1f1b
  probe gpt_v3 4 120 $GPT --pp 4 --schedule interleaved --virtual-stages 3
  probe llama_pp4 4 120 $LLAMA --pp 4
  probe llama_pp2tp2 4 120 $LLAMA --pp 2 --mp 2
fi
