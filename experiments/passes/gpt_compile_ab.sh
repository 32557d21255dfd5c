#!/usr/bin/env bash
# One device call (~6 min, 1 GPU): does torch.compile inside the engine's autograd stages (--compile) pay at the
# GPT-1B shape of experiments/passes/gpt_bench.sh? The engine bf16 1f1b with and without it, beside the
# torch.compile peer, in one job. Logs in ${OUT:-/tmp/he_out}/gpt_compile_ab.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup gpt_compile_ab
gpt_tokens
SHAPE="--hidden 2048 --layers 16 --heads 16"
G="--model gpt $SHAPE --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16 --micro-batches 8"
G="$G --optimizer adamw --lr 3e-4 --steps 10 --warmup 4 --seed 0 --amp bf16 --quiet"
run() {  # name args...: the driver with a compile-sized time limit
  local name=$1; shift
  timeout 300 torchrun --nproc_per_node=1 hybrid_engine.py "$@" > "$RES/$name.log" 2>&1 \
    || { echo "$name FAILED"; tail -6 "$RES/$name.log"; }
  echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}
run gpt_bf16_1f1b $G
run gpt_bf16_1f1b_compile $G --compile
timeout 240 torchrun --nproc_per_node=1 experiments/peers/gpt_peers.py --mode torch-compile $SHAPE --seq 2048 \
  --vocab 32000 --mbs 2 --micro 8 --steps 10 --warmup 4 > "$RES/peer_torch-compile.log" 2>&1 \
  || { echo "peer FAILED"; tail -5 "$RES/peer_torch-compile.log"; }
grep '^{' "$RES/peer_torch-compile.log" | tail -1
tar czf "$OUT/gpt_compile_ab.tgz" -C "$RES" .
