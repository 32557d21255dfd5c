#!/usr/bin/env bash
# One device call (~3 min, 2 GPUs): the GPT-1B shape at tp=2, without and with --sequence-parallel, and with
# --sequence-parallel on the list-form collectives of before (hybrid_engine/parallel/tensor/sequence_parallel.py as of a18bd88,
# carried as .ab/sequence_parallel_old.py and swapped in for that run only). Logs in ${OUT:-/tmp/he_out}/sp_ab.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup sp_ab
gpt_tokens
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16"
G="$G --micro-batches 8 --steps 8 --warmup 3 --seed 0 --optimizer adamw --lr 3e-4 --amp bf16 --mp 2"
engine tp2 2 $G
engine tp2_sp_flat 2 $G --sequence-parallel
if [ -f .ab/sequence_parallel_old.py ]; then
  cp hybrid_engine/parallel/tensor/sequence_parallel.py /tmp/sequence_parallel_new.py
  cp .ab/sequence_parallel_old.py hybrid_engine/parallel/tensor/sequence_parallel.py
  engine tp2_sp_list 2 $G --sequence-parallel
  cp /tmp/sequence_parallel_new.py hybrid_engine/parallel/tensor/sequence_parallel.py
fi
engine tp2_sp_flat_again 2 $G --sequence-parallel
last_losses
tar czf "$OUT/sp_ab.tgz" -C "$RES" .
