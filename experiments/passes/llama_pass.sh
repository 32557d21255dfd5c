#!/usr/bin/env bash
# The Llama pass (issue 28), one device call per phase, each under one budget (PASS_BUDGET_S, default 540 s):
#
#   PHASE=1gpu  one card: a Llama-1B-like shape (hidden 2048, 16 layers, 32 heads, 8 kv heads, ffn 5632, seq 2048,
#               vocabulary 32000, 16 sequences in 8 micro-batches, bf16) in the engine (its defaults: CUDA graphs
#               auto, which graphs one GPU's stages; --cuda-graphs off; torch.compile'd stages; 4 micro-batches of
#               4; selective recompute) beside plain PyTorch eager and compiled (experiments/peers/llama_peers.py:
#               SDPA with GQA, nn.RMSNorm, SwiGLU, RoPE, bf16 autocast, fused AdamW), Hugging Face transformers'
#               LlamaForCausalLM compiled (the same recipe) and Megatron-core 0.16.1 configured as a Llama with its
#               local spec (megatron_llama.py says what that spec refuses without TE/apex). Targets, the engine's
#               best run at the peers' 8 micro-batches: >= 1.15x plain PyTorch compiled, >= 1.3x Hugging Face
#               compiled, >= 2x Megatron-core.
#   PHASE=4gpu  four cards, pp2 x tp2: the engine (1f1b, zb1 + merged W, sequence parallel, compiled stages)
#               beside Megatron-core's pp2 x tp2. Target: >= 2x Megatron-core.
#
# Every run has the same recipe: AdamW lr 3e-4, weight decay 0.1 (matrices only), betas 0.9/0.95, clipping at 1.0
# (the engine's default for the Llama, the peers' and Megatron's setting), the engine's draw of synthetic tokens.
# Runs go in priority order; one that no longer fits the budget is skipped and said. MFU is in every row of the
# table experiments/analysis/llama_results.py prints and writes. RUNS (names, space-separated) keeps only those runs. Megatron comes from its cp312 wheel in .whl/
# (carry it). DEVICE_SO: a prebuilt _C of this tree, copied in place instead of building.
# Out: ${OUT:-/tmp/he_out}/llama_<phase>.tgz (logs, metrics, commands) and <date>-<n>x<card>-llama-<phase>.json.
#
#   PHASE=1gpu bash experiments/passes/llama_pass.sh      # device kind nvidia-h100-x1
#   PHASE=4gpu bash experiments/passes/llama_pass.sh      # device kind nvidia-h100-x4
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PHASE=${PHASE:-1gpu}
[[ $PHASE == 1gpu || $PHASE == 4gpu ]] || { echo "PHASE must be 1gpu or 4gpu, got $PHASE"; exit 2; }
pass_start llama_$PHASE
if ls .whl/megatron_core-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/mcore .whl/megatron_core-*.whl > "$RES/mcore.log" 2>&1
fi
write_tokens /tmp/llama_tokens.bin 32000 8000000

SHAPE="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048"
RUN="--data /tmp/llama_tokens.bin --batch-size 16 --micro-batches 8 --steps 8 --warmup 3 --seed 0 --lr 3e-4"
L="--model llama $SHAPE $RUN --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 --amp bf16"
MCORE="/tmp/mcore:${PYTHONPATH:-}"
wanted() { [[ -z "${RUNS:-}" || " $RUNS " == *" $1 "* ]]; }
engine() {  # name gpus driver-args...
  local name=$1 n=$2; shift 2
  wanted "$name" || return 0
  budget_run "$name" 240 torchrun --nproc_per_node="$n" hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" "$@" \
    && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}
peer() {  # name gpus limit mode
  local name=$1 n=$2 limit=$3 mode=$4
  wanted "$name" || return 0
  PYTHONPATH=$MCORE CUDA_DEVICE_MAX_CONNECTIONS=1 budget_run "$name" "$limit" torchrun --nproc_per_node="$n" \
    experiments/peers/llama_peers.py --mode "$mode" $SHAPE $RUN \
    && echo "$name: $(grep '^{' "$RES/$name.log" | tail -1 | grep -o '"tokens_s": [0-9]*, "tflops_per_gpu": [0-9.]*, "mfu": [0-9.]*')"
}

if [[ $PHASE == 1gpu ]]; then
  engine llama_1gpu 1 $L
  engine llama_1gpu_eager 1 $L --cuda-graphs off
  peer torch_compile_1gpu 1 240 torch-compile
  peer hf_compile_1gpu 1 240 hf-compile
  peer megatron_1gpu 1 180 megatron
  peer torch_1gpu 1 150 torch
  engine llama_1gpu_compile 1 $L --compile
  engine llama_1gpu_m4 1 ${L/--micro-batches 8/--micro-batches 4}
  engine llama_1gpu_selective 1 $L --recompute selective
else
  engine llama_pp2tp2 4 $L --pp 2 --mp 2
  peer megatron_pp2tp2 4 200 megatron-pp-tp
  engine llama_pp2tp2_zb1 4 $L --pp 2 --mp 2 --schedule zb1 --merge-wgrad
  engine llama_pp2tp2_sp 4 $L --pp 2 --mp 2 --sequence-parallel
  engine llama_pp2tp2_compile 4 $L --pp 2 --mp 2 --compile
fi

CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$(python3 -c 'import torch; print(torch.__version__)')
GPUS=$([[ $PHASE == 1gpu ]] && echo 1 || echo 4)
RESULT="$OUT/$(date +%F)-${GPUS}x${SHORT:-gpu}-llama-$PHASE.json"
python3 experiments/analysis/llama_results.py "$RES" "$RESULT" --phase "$PHASE" --card "$CARD" --torch "$TORCH" \
    | tee "$RES/results.txt"
tar czf "$OUT/llama_$PHASE.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/llama_$PHASE.tgz after ${SECONDS}s"
