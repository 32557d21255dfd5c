#!/usr/bin/env bash
# One device call (~6 min, 2 GPUs): the GPT-1B shape of experiments/passes/gpt_bench.sh (bf16, AdamW, 1f1b) at dp=2,
# with and without --zero 1, each beside the 1-GPU run of the same flags in one job: strong scaling (the 1-GPU
# batch of 16 sequences, 4 micro-batches per replica) and weak (32 sequences, 8 per replica); the summary lines
# carry tokens/s, MFU and peak memory per rank. Logs in ${OUT:-/tmp/he_out}/gpt_dp_pass.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup gpt_dp_pass
gpt_tokens
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --amp bf16"
G="$G --optimizer adamw --lr 3e-4 --steps 8 --warmup 3 --seed 0"
engine gpt_single 1 $G --batch-size 16 --micro-batches 8
engine gpt_dp2 2 --dp 2 $G --batch-size 16 --micro-batches 4
engine gpt_dp2_zero 2 --dp 2 $G --batch-size 16 --micro-batches 4 --zero 1
engine gpt_dp2w 2 --dp 2 $G --batch-size 32 --micro-batches 8
engine gpt_dp2w_zero 2 --dp 2 $G --batch-size 32 --micro-batches 8 --zero 1
tar czf "$OUT/gpt_dp_pass.tgz" -C "$RES" .
