#!/usr/bin/env bash
# One device call (~3 min, 2 GPUs): the GPT-1B shape at dp=2 with --zero 1, its autograd stage announcing final
# gradients from the parameters' post-accumulate hooks (now) against hybrid_engine/parallel/data_parallel/grad_buffer.py as of cc94a0e
# (.ab/grad_buffer_old.py: no announcements from autograd, so every bucket started after the backward), and a
# --trace of each. Logs and traces in ${OUT:-/tmp/he_out}/announce_ab.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup announce_ab
gpt_tokens
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --amp bf16"
G="$G --optimizer adamw --lr 3e-4 --seed 0 --dp 2 --batch-size 16 --micro-batches 4 --zero 1"
ab() {  # name: the timed run, then a traced one
  engine "gpt_dp2_zero_$1" 2 $G --steps 6 --warmup 2
  engine "trace_gpt_dp2_zero_$1" 2 $G --steps 3 --warmup 1 --trace "$RES/trace_gpt_dp2_zero_$1"
}
ab announced
cp hybrid_engine/parallel/data_parallel/grad_buffer.py /tmp/grad_buffer_new.py && cp .ab/grad_buffer_old.py hybrid_engine/parallel/data_parallel/grad_buffer.py
ab after_backward
cp /tmp/grad_buffer_new.py hybrid_engine/parallel/data_parallel/grad_buffer.py
ab announced_again
grep -h "^trace:" "$RES"/trace_*.log
tar czf "$OUT/announce_ab.tgz" -C "$RES" .
