#!/usr/bin/env bash
# Where ZeRO-3's memory goes on the 8B Llama shape at dp2 (one 2-GPU machine, PASS_BUDGET_S, default 330 s): the
# same run as zero_sharding_pass.sh's zero3 at 8 micro-batches, once with the fused kernels off and once with full
# recompute, each line its peak memory (or, HYBRID_ENGINE_DEBUG=1 keeping the traceback, what PyTorch held when it ran out). A run that fits only
# without the fused kernels puts the excess there; one that fits only with full recompute, in what a forward keeps.
#
#   bash experiments/passes/zero3_memory_probe.sh          # device kind nvidia-h200-x2
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_start zero3_memory_probe
write_tokens /tmp/zero3_probe_tokens.bin 128256 2000000
L="--model llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --ffn-hidden 14336 --seq-len 4096
   --data /tmp/zero3_probe_tokens.bin --batch-size 16 --micro-batches 8 --seed 0 --lr 3e-4 --optimizer adamw
   --amp bf16 --dp 2 --zero 3 --steps 4 --warmup 1 --schedule 1f1b"
for run in "fused_off --fused-kernels off" "recompute_full --recompute full"; do
  name=${run%% *}; flags=${run#* }
  HYBRID_ENGINE_DEBUG=1 budget_run "$name" 150 torchrun --nproc_per_node=2 hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" $L $flags \
    && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
  grep -o "Tried to allocate.*" "$RES/$name.log" | head -1 | cut -c1-400
done
tar -czf "$OUT/zero3_memory_probe.tgz" -C "$RES" .
