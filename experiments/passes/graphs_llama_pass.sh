#!/usr/bin/env bash
# CUDA-graphed transformer stages (issue 38, item 1), one device call on 4 GPUs, under one budget (PASS_BUDGET_S,
# default 570 s): the Llama-1B class (hidden 2048, 16 layers, 32/8 heads, ffn 5632, seq 2048, vocabulary 32000,
# 16 sequences in 8 micro-batches under 1F1B, bf16 half weights, AdamW) on one GPU, tp4, pp4 and pp2 x tp2, each
# with --cuda-graphs off and on, each its own run (one that no longer fits the budget is skipped and said; one GPU
# first, then the grids). The graphed runs capture at their second step: the timing leaves out the first three.
# Every run: tokens/s, peak memory, the last loss and the engine's CUDA-graphs line. Out:
# $OUT/<date>-<n>x<card>-graphs-llama.json (experiments/analysis/graphs_llama_results.py: on against off per grid,
# each 4-GPU run against 4 x one GPU) and graphs-llama.tgz (logs).
#
# WITH_TESTS=1 first runs the transformers' graph tests (tests/parallel/test_cuda_graphs_decoders_gpu.py on 1, 2 and
# 4 GPUs; SMOKE=1: their host-replayed CPU form, tests/parallel/test_graphed_decoders.py) within the same budget.
#
# ON=auto runs the graphed runs under --cuda-graphs auto (what a run that leaves the choice to the engine gets: the
# results' CUDA-graphs line says what auto chose); RUNS="tp4_off tp4_on" runs only the runs named. pp4w and
# pp2tp2w are pp4 and pp2 x tp2 with whole blocks on every stage (--split-blocks off), last.
#
#   bash experiments/passes/graphs_llama_pass.sh                # device kind nvidia-h100-x4
#   SMOKE=1 bash experiments/passes/graphs_llama_pass.sh        # tiny, on this CPU (gloo ranks; graphs auto: off)
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
SMOKE=${SMOKE:-0}
PY=${PYTHON:-python3}
if [[ $SMOKE == 1 ]]; then
  smoke_start graphs_llama 570 5
  export CUDA_VISIBLE_DEVICES="" GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
  GPUS_SEEN=4; CARD="cpu"
  SHAPE="--hidden 64 --layers 4 --heads 4 --kv-heads 4 --ffn-hidden 128 --seq-len 32 --vocab-size 512"
  RUN="--batch-size 8 --micro-batches 4 --steps 4 --warmup 2"
  AMP="--amp off"
  ON="auto"  # the CPU has no CUDA graphs: auto says so, on would end the run
  TESTS="tests/parallel/test_graphed_decoders.py"
else
  PASS_BUDGET_S=${PASS_BUDGET_S:-570} pass_start graphs_llama
  GPUS_SEEN=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  SHAPE="--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048 --vocab-size 32000"
  RUN="--batch-size 16 --micro-batches 8 --steps 8 --warmup 3"
  AMP="--amp bf16"
  ON=${ON:-on}  # ON=auto: the graphed runs under auto, what a run that leaves the choice to the engine gets
  TESTS="tests/parallel/test_cuda_graphs_decoders_gpu.py"
fi
if [[ ${WITH_TESTS:-0} == 1 ]]; then
  budget_run graph_tests 300 $PY -m pytest -q -p no:cacheprovider -n 0 $TESTS
  echo "graph tests: $(tail -1 "$RES/graph_tests.log")"
  grep -E "^(FAILED|ERROR)" "$RES/graph_tests.log"
fi
COMMON="--model llama --seed 0 --lr 3e-4 --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 $AMP \
--schedule 1f1b --virtual-stages 1 --lookahead 0 --no-merge-wgrad --zero 0 --dp 1"

run() {  # name nproc limit_s driver-args...
  local name=$1 n=$2 limit=$3; shift 3
  [[ -z "${RUNS:-}" || " $RUNS " == *" $name "* ]] || return 0  # RUNS="tp4_off tp4_on": only those runs
  budget_run "$name" "$limit" $PY -m hybrid_engine.launch --nproc_per_node="$n" hybrid_engine.py --quiet \
      --metrics "$RES/$name.jsonl" $COMMON $SHAPE $RUN "$@" \
    && echo "$name: $(grep -o 'median step.*' "$RES/$name.log") | $(grep -m1 '^CUDA graphs ' "$RES/$name.log")"
}

run gpu1_off 1 110 --pp 1 --mp 1 --cuda-graphs off
run gpu1_on 1 120 --pp 1 --mp 1 --cuda-graphs "$ON"
if ((GPUS_SEEN >= 4)); then
  for grid in "tp4 --pp 1 --mp 4" "pp4 --pp 4 --mp 1" "pp2tp2 --pp 2 --mp 2" \
              "pp4w --pp 4 --mp 1 --split-blocks off" "pp2tp2w --pp 2 --mp 2 --split-blocks off"; do
    read -r name flags <<< "$grid"
    run "${name}_off" 4 80 $flags --cuda-graphs off
    run "${name}_on" 4 90 $flags --cuda-graphs "$ON"
  done
else
  echo "tp4, pp4, pp2 x tp2: $GPUS_SEEN GPUs seen, 4 needed: skipped"
fi

SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$($PY -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-${GPUS_SEEN}x${SHORT:-$CARD}-graphs-llama.json"
$PY experiments/analysis/graphs_llama_results.py "$RES" "$RESULT" --card "$CARD" --torch "$TORCH" \
    --shape "$SHAPE $RUN" | tee "$RES/results.txt"
tar czf "$OUT/graphs-llama.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/graphs-llama.tgz after ${SECONDS}s"
