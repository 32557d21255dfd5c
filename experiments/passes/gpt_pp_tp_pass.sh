#!/usr/bin/env bash
# One device call (~8 min, 2 GPUs; issue #20): the GPT-1B shape of experiments/passes/gpt_bench.sh (hidden 2048, 16
# layers, 16 heads, seq 2048, vocabulary 32000, 16 sequences in 8 micro-batches, AdamW, bf16) at pp=2 and tp=2 in
# the engine and its peers, one job:
#   references  the engine on 1 GPU (1f1b, and zb1 + merged W), one per GPU side by side: the losses to reproduce
#   pp=2        engine 1f1b, zb1 + merged W (and + --lookahead 1); torch.distributed.pipelining Schedule1F1B,
#               eager and per-block compiled; Megatron-core's 1F1B (local spec)
#   tp=2        engine with and without --sequence-parallel; DTensor TP (torchtitan's plan) with and without
#               SequenceParallel; Megatron-core tp=2 with and without sequence_parallel (local spec)
# Runs go in priority order under one time budget (PASS_BUDGET_S, default 520 s from the start): a run that no
# longer fits is skipped and said, so the results file and the archive are always written. Megatron-core 0.16.1
# comes from its cp312 wheel, carried in .whl/. Out: ${OUT:-/tmp/he_out}/<date>-2x<card>-gpt-pp-tp.json and
# gpt_pp_tp_pass.tgz (every log, metrics file and command).
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
DEADLINE=$((SECONDS + ${PASS_BUDGET_S:-520}))
RESERVE=20  # seconds kept for the results file and the archive
pass_setup gpt_pp_tp
rm -f "$RES"/*.log "$RES"/*.jsonl "$RES"/*.cmd "$RES"/*.rc "$RES/skipped.txt"
if ls .whl/megatron_core-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/mcore .whl/megatron_core-*.whl > "$RES/mcore.log" 2>&1
else
  echo "no .whl/megatron_core-*.whl: the Megatron runs will fail"
fi
gpt_tokens

engine() {  # name nproc driver-args...
  local name=$1 n=$2; shift 2
  budget_run "$name" 150 torchrun --nproc_per_node="$n" hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" $G "$@" \
    && grep -o 'summary.*' "$RES/$name.log" | sed "s|^|$name: |"
}
peer() {  # name mode [limit]: experiments/peers/gpt_pp_tp_peers.py on both GPUs
  budget_run "$1" "${3:-150}" torchrun --nproc_per_node=2 experiments/peers/gpt_pp_tp_peers.py --mode "$2" $P \
    && grep '^{' "$RES/$1.log" | tail -1 | cut -c1-400
}

SHAPE="--hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16"
SHAPE="$SHAPE --micro-batches 8 --steps 8 --warmup 3 --seed 0"
G="--model gpt $SHAPE --optimizer adamw --lr 3e-4 --amp bf16"
P="$SHAPE --lr 3e-4 --precision bf16"
ZB="--schedule zb1 --merge-wgrad"

# the two 1-GPU references side by side (own rendezvous ports): only their losses are needed
CUDA_VISIBLE_DEVICES=0 PET_MASTER_PORT=29511 engine engine_1gpu 1 &
CUDA_VISIBLE_DEVICES=1 PET_MASTER_PORT=29512 engine engine_1gpu_zb1m 1 $ZB &
wait
engine engine_pp2_1f1b 2 --pp 2
engine engine_pp2_zb1m 2 --pp 2 $ZB
engine engine_tp2 2 --mp 2
engine engine_tp2_sp 2 --mp 2 --sequence-parallel
peer torch_pp torch-pp
peer dtensor_tp dtensor-tp
peer dtensor_tp_sp dtensor-tp-sp
peer torch_pp_compile torch-pp-compile 240
MCORE="/tmp/mcore:${PYTHONPATH:-}"  # and CUDA_DEVICE_MAX_CONNECTIONS=1, on which Megatron's TP overlap relies
PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 peer megatron_pp megatron-pp
PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 peer megatron_tp megatron-tp
PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 peer megatron_tp_sp megatron-tp-sp
engine engine_pp2_zb1m_ahead1 2 --pp 2 $ZB --lookahead 1  # last: a variant, the first to go when time is short

CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$(python3 -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-2x${SHORT:-gpu}-gpt-pp-tp.json"
python3 experiments/analysis/gpt_pp_tp_results.py "$RES" "$RESULT" --card "2 x $CARD, torch $TORCH" | tee "$RES/results.txt"
cp "$RESULT" "$RES/"
tar czf "$OUT/gpt_pp_tp_pass.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/gpt_pp_tp_pass.tgz after ${SECONDS}s"
