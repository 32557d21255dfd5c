#!/usr/bin/env bash
# The long-sequence pass: context parallelism on one 4-GPU machine, one device call (PASS_BUDGET_S, default 540 s).
#
# A Llama-1B-class model (hidden 2048, 16 layers, 32 heads, 8 kv heads, ffn 5632, vocabulary 32000, RoPE theta 5e5),
# one sequence per step, bf16 half weights, AdamW; 5 steps, the first 2 left out of the medians:
#   gpu1_8k          one GPU at 8k tokens (the reference MFU)
#   cp4_16k .. 128k  --cp 4 at 16k, 32k, 64k, 128k (ring attention: the planner's rule, said at start; the blocks
#                    by the kernel torch's SDPA runs for them, cuDNN's on Hopper)
#   cp4_32k_flash    --cp 4 at 32k with the blocks by aten's flash kernel (--cp-kernel flash): the kernel's A/B
#   cp2tp2_32k       --cp 2 --mp 2 --sequence-parallel at 32k (the variant the planner's rule says at start)
#   torch_cp4_32k    torch's context_parallel (SDPA, DDP) on the same 4 GPUs at 32k
#                    (experiments/peers/torch_cp_llama.py)
#   cp4_32k_gather   --cp 4 --cp-comm all-gather at 32k and 16k (cp4_16k_gather), the other variant, if the
#                    budget still allows
#   gpu1_32k, 64k    one GPU at 32k, then 64k if 32k trained: the longest sequence one GPU holds
#   cp2tp2_128k      --cp 2 --mp 2 --sequence-parallel at 128k
# tokens/s, MFU (the engine's formula, attention counted: 6 N + 12 L s heads d per token; and its causal half) and
# peak memory per GPU of every run, the targets checked, in one JSON: $OUT/<date>-4x<card>-long-seq.json (and the
# logs in $OUT/long_seq.tgz), written by experiments/analysis/long_seq_results.py.
# Expected on 4 x H100: ~100 s of build (none with DEVICE_SO), then ~30-40 s a run at 8k-32k, ~60 s at 64k and
# ~90 s at 128k: about 7 minutes in all.
#
#   bash experiments/passes/long_seq_pass.sh                 # device kind nvidia-h100-x4
#   SMOKE=1 bash experiments/passes/long_seq_pass.sh         # CPU, gloo, a tiny shape: that it runs (~3 min, 2 cores)
#   RUNS="gpu1_8k cp4_16k cp4_64k": only the runs named (in the pass's order), e.g. what an earlier call left out
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
SMOKE=${SMOKE:-0}
PY=${PYTHON:-python3}
if [[ $SMOKE == 1 ]]; then
  smoke_start long_seq 600 10
  SHAPE="--hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn-hidden 128"
  SEQS=(256 512 1024 2048); BASE=256; MID=512; DEV="--device cpu"; PEER_DEV="--device cpu"; VOCAB=500
  LIMIT=150
else
  pass_start long_seq
  SHAPE="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632"
  SEQS=(16384 32768 65536 131072); BASE=8192; MID=32768; DEV=""; PEER_DEV=""; VOCAB=32000
  LIMIT=150
fi
write_tokens /tmp/long_seq_tokens.bin "$VOCAB" 4000000
RUN="--data /tmp/long_seq_tokens.bin --batch-size 1 --micro-batches 1 --schedule 1f1b --lookahead 0 --virtual-stages 1"
RUN="$RUN --no-merge-wgrad --steps 5 --warmup 2 --seed 0 --rope-theta 500000 --max-positions 131072"
L="--model llama $SHAPE $RUN --optimizer adamw --lr 3e-4 --weight-decay 0.1 --betas 0.9,0.95 $DEV"
[[ $SMOKE == 1 ]] || L="$L --amp bf16"
LAUNCH=(torchrun); [[ $SMOKE == 1 ]] && LAUNCH=("$PY" -m torch.distributed.run)
want() { [[ -z ${RUNS:-} || " $RUNS " == *" $1 "* ]]; }  # RUNS="cp4_32k gpu1_8k": only those runs, in pass order
engine() {  # name gpus seq driver-args...
  local name=$1 n=$2 seq=$3; shift 3
  want "$name" || return 0
  budget_run "$name" "$LIMIT" "${LAUNCH[@]}" --nproc_per_node="$n" hybrid_engine.py --quiet \
    --metrics "$RES/$name.jsonl" $L --seq-len "$seq" "$@" && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}

C=${CP:-4}  # the cp size of the runs (CP=2 on a 2-GPU machine: no cp2 x tp2 run then)
engine gpu1_8k 1 $BASE
engine cp${C}_32k $C $MID --cp $C
[[ $SMOKE == 1 ]] || engine cp${C}_32k_flash $C $MID --cp $C --cp-kernel flash
want torch_cp${C}_32k && budget_run torch_cp${C}_32k "$LIMIT" "${LAUNCH[@]}" --nproc_per_node=$C experiments/peers/torch_cp_llama.py \
    --data /tmp/long_seq_tokens.bin $SHAPE --seq-len $MID --steps 5 --warmup 2 $PEER_DEV \
    && echo "torch_cp${C}_32k: $(grep '^{' "$RES/torch_cp${C}_32k.log")"
engine cp${C}_128k $C ${SEQS[3]} --cp $C
(( C == 4 )) && engine cp2tp2_32k 4 $MID --cp 2 --mp 2 --sequence-parallel
engine cp${C}_64k $C ${SEQS[2]} --cp $C
engine cp${C}_16k $C ${SEQS[0]} --cp $C
engine cp${C}_32k_gather $C $MID --cp $C --cp-comm all-gather
engine cp${C}_16k_gather $C ${SEQS[0]} --cp $C --cp-comm all-gather
# one GPU at longer sequences, until one does not fit (the longest that trains is the results' one_gpu_longest)
engine gpu1_32k 1 $MID && engine gpu1_64k 1 ${SEQS[2]}
(( C == 4 )) && engine cp2tp2_128k 4 ${SEQS[3]} --cp 2 --mp 2 --sequence-parallel

CARD=$( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo cpu) | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$($PY -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-${C}x${SHORT:-$CARD}-long-seq$([[ $SMOKE == 1 ]] && echo -smoke).json"
$PY experiments/analysis/long_seq_results.py "$RES" "$RESULT" --card "$CARD" --torch "$TORCH" --vocab "$VOCAB" \
    | tee "$RES/results.txt"
tar czf "$OUT/long_seq$([[ $SMOKE == 1 ]] && echo _smoke).tgz" -C "$RES" .
echo "wrote $RESULT after ${SECONDS}s"
