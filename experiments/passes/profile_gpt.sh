#!/usr/bin/env bash
# One device call (~4 min, 1 GPU): torch.profiler over the engine's GPT-1B step (the shape of
# experiments/passes/gpt_bench.sh, bf16, 1f1b), top kernels and GPU-busy share; the output and a Chrome trace land in ${OUT:-/tmp/he_out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup profile_gpt
gpt_tokens
timeout 400 torchrun --nproc_per_node=1 experiments/bench/profile_gpt.py --model gpt --hidden 2048 --layers 16 --heads 16 \
  --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16 --micro-batches 8 --amp bf16 --optimizer adamw \
  --lr 3e-4 --steps 6 "$@" 2>&1 | tee "$OUT/profile_gpt.txt" | grep -v "^\s*$" | head -60
gzip -f "$OUT"/profile_gpt_rank*.json 2>/dev/null || true
