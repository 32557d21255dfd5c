#!/usr/bin/env bash
# A short look on 2 GPUs before optimising (one device call, ~4 min): build, then torch.profiler breakdowns of
# the configs still short of their targets, each rank's Chrome trace kept for reading offline:
#   C  fp16 pp=2 zb1 + merged W + lookahead 1 (host latency per action),
#   L  fp16 dp=2 zb1 + merged W (is the DP all-reduce hidden behind the backward?),
# and the timings of both with the same flags.
# Logs and traces land in ${OUT:-/tmp/he_out}/profile_pass.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup profile_pass
C="--pp 2 --dim 8192 --depth 8 --batch-size 64 --micro-batches 4 --lookahead 1"
Ldp="--dp 2 --pp 1 --dim 8192 --depth 16 --batch-size 1024 --micro-batches 8"
for cfg in C Ldp; do
  timeout 150 torchrun --nproc_per_node=2 experiments/bench/profile_engine.py ${!cfg} --amp fp16 --schedule zb1 --merge-wgrad \
    --steps 3 --out "$RES" > "$RES/profile_$cfg.txt" 2>&1 || tail -5 "$RES/profile_$cfg.txt"
  mkdir -p "$RES/$cfg"; mv "$RES"/profile_rank*.json "$RES/$cfg/" 2>/dev/null
  grep -E "^rank|Self CUDA total" "$RES/profile_$cfg.txt" | sed "s/^/$cfg /"
  timeout 90 torchrun --nproc_per_node=2 hybrid_engine.py ${!cfg} --amp fp16 --schedule zb1 --merge-wgrad \
    --steps 20 --warmup 5 --quiet > "$RES/time_$cfg.log" 2>&1; grep summary "$RES/time_$cfg.log" | sed "s/^/$cfg /"
done
tar czf "$OUT/profile_pass.tgz" -C "$RES" .
