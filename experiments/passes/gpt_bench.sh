#!/usr/bin/env bash
# One device call (~8 min, 1 GPU): the GPT-1B shape of the GPT issue (hidden 2048, 16 layers, 16 heads, seq 2048,
# vocabulary 32000, 2 sequences x 8 micro-batches per step, AdamW, bf16) in the engine and in its peers, one job:
# plain PyTorch eager and torch.compile, Megatron-core 0.16.1 (local spec; its wheel is carried in .whl/), and the
# engine (1f1b and zb1 + merged W; fp16 with dynamic loss scaling beside bf16). Synthetic uniform tokens for all.
# One JSON line per peer run and the engine's summary lines; logs in ${OUT:-/tmp/he_out}/gpt_bench.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
pass_setup gpt_bench
if ls .whl/megatron_core-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/mcore .whl/megatron_core-*.whl > "$RES/mcore.log" 2>&1
fi
SHAPE="--hidden 2048 --layers 16 --heads 16"
gpt_tokens
G="--model gpt $SHAPE --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16 --micro-batches 8"
G="$G --optimizer adamw --lr 3e-4 --steps 8 --warmup 3 --seed 0"
engine gpt_bf16_1f1b 1 $G --amp bf16
engine gpt_bf16_zb1m 1 $G --amp bf16 --schedule zb1 --merge-wgrad
engine gpt_fp16_zb1m 1 $G --amp fp16 --schedule zb1 --merge-wgrad
for f in "$RES"/gpt_*.log; do grep -o "tokens/s.*" "$f" | sed "s|^|$(basename "$f" .log): |"; done
for mode in torch torch-compile megatron; do
  PYTHONPATH=/tmp/mcore:${PYTHONPATH:-} timeout 240 torchrun --nproc_per_node=1 experiments/peers/gpt_peers.py \
    --mode $mode $SHAPE --seq 2048 --vocab 32000 --mbs 2 --micro 8 --steps 8 --warmup 3 \
    > "$RES/peer_$mode.log" 2>&1 || { echo "peer $mode FAILED"; tail -5 "$RES/peer_$mode.log"; }
  grep '^{' "$RES/peer_$mode.log" | tail -1
done
tar czf "$OUT/gpt_bench.tgz" -C "$RES" .
