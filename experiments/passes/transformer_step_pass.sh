#!/usr/bin/env bash
# The transformer step on single GPUs, one device call on a 4-GPU machine under one budget (PASS_BUDGET_S, default
# 300 s; a run that no longer fits is skipped and said):
#
#   gpu_tests    the graphed transformer stages' GPU test (tests/parallel/test_cuda_graphs_decoders_gpu.py: graphs
#                on and off alike on 1, 2 and 4 GPUs) and the fused kernels' (tests/kernels/test_fused_kernels.py)
#   head_bench   experiments/bench/head_grad_bench.py: the fused head's weight gradient at the 8B's head, half
#                products copied to fp32 against one GEMM with an fp32 output
#   l4_bf16, l4_bf16_graphs, l4_fp8, l4_fp8_rowwise
#                the 8B layer shape cut to 4 layers (hidden 4096, ffn 14336, 32/8 heads, seq 4096, vocabulary
#                128256; 8 sequences in 8 micro-batches, 1f1b, bf16, AdamW, fused kernels on): eager, with
#                --cuda-graphs on, with --fp8 (tensor-wise) and with --fp8 --fp8-recipe rowwise, side by side on
#                GPUs 0-3 (one job, the same machine); with OLD=<folder of an earlier tree, its _C built>, GPUs 2
#                and 3 run that tree's bf16 and fp8 instead (l4_bf16_old, l4_fp8_old): a change's A/B in one job
#                (on two GPUs: the two bf16 runs side by side, then the two fp8 runs)
#
# Out: $OUT/<date>-<card>-transformer-step.json (experiments/analysis/transformer_step_results.py: the tests'
# summary line, the bench's record, each run's step, tokens/s, MFU and peak, graphs / eager and fp8 / bf16) and
# transformer_step.tgz (logs).
#
#   bash experiments/passes/transformer_step_pass.sh               # device kind nvidia-h100-x4
#   TESTS=0 HEAD=0 bash experiments/passes/transformer_step_pass.sh   # without the GPU tests and the head's bench
#   EXTRA="--compile" ...                                         # flags added to every l4 run (whole stages
#                                                                 # compiled: fp8's quantization fused by Inductor)
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PASS_BUDGET_S=${PASS_BUDGET_S:-300} pass_start transformer_step
rm -f "$RES"/*.log "$RES"/*.jsonl "$RES"/*.cmd "$RES"/*.rc "$RES/skipped.txt"
if [[ ${TESTS:-1} == 1 ]]; then
  budget_run gpu_tests 170 python3 -m pytest -q -x -p no:cacheprovider -n 0 \
      tests/parallel/test_cuda_graphs_decoders_gpu.py tests/kernels/test_fused_kernels.py
  tail -3 "$RES/gpu_tests.log"
fi
if [[ ${HEAD:-1} == 1 ]]; then
  budget_run head_bench 40 python3 experiments/bench/head_grad_bench.py && tail -1 "$RES/head_bench.log"
fi

L4="--model llama --hidden 4096 --layers 4 --heads 32 --kv-heads 8 --ffn-hidden 14336 --seq-len 4096 \
--vocab-size 128256 --rope-theta 500000 --batch-size 8 --micro-batches 8 --steps 6 --warmup 2 --seed 0 --lr 3e-4 \
--optimizer adamw --amp bf16 --fused-kernels on --schedule 1f1b"
side() {  # name gpu port driver-args...: one single-GPU run in the background, logged as budget_run logs (a name
  # ending in _old runs the tree in $OLD, from its folder)
  local name=$1 gpu=$2 port=$3 dir=$PWD; shift 3
  [[ $name == *_old ]] && dir=$OLD
  local cmd="torchrun --nproc_per_node=1 --master_port=$port hybrid_engine.py --quiet --metrics $RES/$name.jsonl $L4 $* \
${EXTRA:-}"
  echo "$cmd" > "$RES/$name.cmd"
  (cd "$dir" && CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" timeout -k 5 90 $cmd \
     > "$RES/$name.log" 2>&1; echo $? > "$RES/$name.rc") &
}
if (( DEADLINE - SECONDS - RESERVE > 90 )); then
  if [[ -n ${OLD:-} ]] && (( $(nvidia-smi -L | wc -l) < 4 )); then  # two GPUs: bf16, then fp8, each pair side by side
    RUNS="l4_bf16 l4_bf16_old l4_fp8 l4_fp8_old"
    side l4_bf16 0 29601 --cuda-graphs off
    side l4_bf16_old 1 29602 --cuda-graphs off
    wait
    side l4_fp8 0 29603 --cuda-graphs off --fp8
    side l4_fp8_old 1 29604 --cuda-graphs off --fp8
  elif [[ -n ${OLD:-} ]]; then
    RUNS="l4_bf16 l4_fp8 l4_bf16_old l4_fp8_old"
    side l4_bf16 0 29601 --cuda-graphs off
    side l4_fp8 1 29602 --cuda-graphs off --fp8
    side l4_bf16_old 2 29603 --cuda-graphs off
    side l4_fp8_old 3 29604 --cuda-graphs off --fp8
  else
    RUNS="l4_bf16 l4_bf16_graphs l4_fp8 l4_fp8_rowwise"
    side l4_bf16 0 29601 --cuda-graphs off
    side l4_bf16_graphs 1 29602 --cuda-graphs on
    side l4_fp8 2 29603 --cuda-graphs off --fp8
    side l4_fp8_rowwise 3 29604 --cuda-graphs off --fp8 --fp8-recipe rowwise
  fi
  wait
  for n in $RUNS; do echo "$n: $(grep -o 'median step.*' "$RES/$n.log" | cut -c1-120)"; done
else
  echo "l4 runs SKIPPED ($((DEADLINE - SECONDS - RESERVE)) s of the budget left)"
  printf '%s\n' l4_bf16 l4_bf16_graphs l4_fp8 l4_fp8_rowwise >> "$RES/skipped.txt"
fi

CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
GPUS_SEEN=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
RESULT="$OUT/$(date +%F)-${GPUS_SEEN}x${SHORT:-gpu}-transformer-step.json"
python3 experiments/analysis/transformer_step_results.py "$RES" "$RESULT" --card "$CARD" \
    --torch "$(python3 -c 'import torch; print(torch.__version__)')" | tee "$RES/results.txt"
tar czf "$OUT/transformer_step.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/transformer_step.tgz after ${SECONDS}s"
