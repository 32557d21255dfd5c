#!/usr/bin/env bash
# One device call (~2.5 min, 2 GPUs): the GPT-1B shape at tp=2 with and without --sequence-parallel, after the
# sequence-parallel collectives moved into C++ autograd functions (csrc/tp/sequence_region.cpp): its NCCL path
# runs and its losses equal the run without sequence parallelism. Logs in ${OUT:-/tmp/he_out}/sp_check.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup sp_check
gpt_tokens
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16"
G="$G --micro-batches 8 --steps 6 --warmup 2 --seed 0 --optimizer adamw --lr 3e-4 --amp bf16 --mp 2"
engine tp2 2 $G
engine tp2_sp_cpp 2 $G --sequence-parallel
for f in "$RES"/*.jsonl; do
  echo "$(basename "$f" .jsonl): losses $(grep -o '"loss": [0-9.]*' "$f" | cut -d' ' -f2 | tr '\n' ' ')"
done
tar czf "$OUT/sp_check.tgz" -C "$RES" .
