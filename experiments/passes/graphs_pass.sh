#!/usr/bin/env bash
# CUDA-graphed native stages, one device call on 4 GPUs, under one budget (PASS_BUDGET_S,
# default 420 s):
#
#   1. the graph tests (tests/parallel/test_cuda_graphs_gpu.py: the MLP trained with --cuda-graphs on and off on 1,
#      2 and 4 GPUs, losses and weights equal, the same fp16 loss scales), and the CPU-side graph tests;
#   2. the MLP configs L (dim 8192, depth 16, batch 1024) and C (dim 8192, depth 8, batch 64), fp16, with graphs off
#      and on: one GPU at 1, 4 and 8 micro-batches, then every 4-GPU grid (dp4, pp4, mp4, pp2 x mp2, dp2 x pp2,
#      dp2 x mp2), each in one torchrun (experiments/bench/graphs_sweep.py: 1F1B where the grids pass ran ZB-H1);
#      a sweep cut by the budget keeps the runs it finished.
# Out: $OUT/<date>-<n>x<card>-graphs.json (experiments/analysis/graphs_results.py: each grid's step off and on,
# on/off, against one GPU) and graphs.tgz (logs, the tests' output, the sweeps).
#
#   bash experiments/passes/graphs_pass.sh                 # device kind nvidia-h100-x4
#   SMOKE=1 bash experiments/passes/graphs_pass.sh         # tiny, on this CPU (gloo ranks, graphs replayed by the host)
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
SMOKE=${SMOKE:-0}
PY=${PYTHON:-python3}
if [[ $SMOKE == 1 ]]; then
  smoke_start graphs 420 5
  export CUDA_VISIBLE_DEVICES="" GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
  GPUS_SEEN=4; CARD="cpu"
  TESTS="tests/parallel/test_graphed_stages.py tests/parallel/test_cuda_graphs_gpu.py"
  SWEEP="--device cpu --tiny --steps 4 --warmup 2"
else
  PASS_BUDGET_S=${PASS_BUDGET_S:-420} pass_start graphs
  GPUS_SEEN=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  TESTS="tests/parallel/test_cuda_graphs_gpu.py tests/parallel/test_graphed_stages.py"
  SWEEP="--steps 8 --warmup 3"
fi

budget_run graph_tests 180 $PY -m pytest -q -p no:cacheprovider -n 0 $TESTS
echo "graph tests: $(tail -1 "$RES/graph_tests.log")"
grep -E "^(FAILED|ERROR)" "$RES/graph_tests.log"
budget_run sweep1 100 $PY -m torch.distributed.run --nproc_per_node=1 --master_port=29532 \
    experiments/bench/graphs_sweep.py --out "$RES/sweep1.json" $SWEEP
grep -E "graphs (off|on|host):" "$RES/sweep1.log"
if ((GPUS_SEEN >= 4)); then
  budget_run sweep4 200 $PY -m torch.distributed.run --nproc_per_node=4 --master_port=29531 \
      experiments/bench/graphs_sweep.py --out "$RES/sweep4.json" $SWEEP
  grep -E "graphs (off|on|host):" "$RES/sweep4.log"
else
  echo "sweep4: $GPUS_SEEN GPUs seen, 4 needed: skipped"
fi

SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
TORCH=$($PY -c 'import torch; print(torch.__version__)')
RESULT="$OUT/$(date +%F)-${GPUS_SEEN}x${SHORT:-$CARD}-graphs.json"
$PY experiments/analysis/graphs_results.py "$RESULT" "$RES/sweep4.json" "$RES/sweep1.json" --card "$CARD" \
    --torch "$TORCH" | tee "$RES/results.txt"
tar czf "$OUT/graphs.tgz" -C "$RES" .
echo "wrote $RESULT and $OUT/graphs.tgz after ${SECONDS}s"
