#!/usr/bin/env bash
# A small Llama and a small GPT of the same parameter count on real text, on the CPU (no GPU needed; ~5 min on 2
# cores): does the Llama learn, and where does its validation loss sit beside the GPT's after the same steps?
# The text is .data/python-docs.txt (experiments/bench/real_text.sh), as a byte-level BPE of 2048; both models have
# 4 blocks, hidden 128, 4 heads and a 128-token context (GPT: GELU MLP of 4x, learned positions, 1.33M parameters;
# Llama: 2 kv heads, SwiGLU of 384, RoPE, 1.31M parameters: the GQA and the SwiGLU width chosen so a block holds
# the GPT block's 196,608 weights), 16 sequences a step, the same seed -- the same batches -- and the same recipe:
# AdamW lr 3e-3, 30 warm-up steps, cosine decay to 3e-4, weight decay 0.1 on matrices, betas 0.9,0.95, clip 1.0,
# 300 steps, validation every 50. The two runs share the two cores, one rank each. Writes
# experiments/results/cpu/<date>-llama-vs-gpt-text.json (experiments/analysis/llama_text_results.py; a sub-folder:
# the report's GPU sections do not read it, report/llama.py does) and the logs beside it. For a shorter check:
# STEPS=N (warm-up N / 10), EVAL_EVERY=N, OUTDIR=DIR, TEXT=FILE, BPE=N.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEXT=${TEXT:-.data/python-docs.txt}
[ -s "$TEXT" ] || { echo "error: no text at $TEXT: make it with bash experiments/bench/real_text.sh"; exit 2; }
python3 -c "import tokenizers" 2> /dev/null || { echo "error: the tokenizers package is missing (scripts/setup.sh installs it)"; exit 2; }
STEPS=${STEPS:-300}
LR_WARMUP=$(( STEPS / 10 ))  # 30 of 300
EVAL_EVERY=${EVAL_EVERY:-50}
BPE=${BPE:-2048}
RES=$(mktemp -d /tmp/llama_text_cpu.XXXX)
OUTDIR=${OUTDIR:-experiments/results/cpu}
mkdir -p "$OUTDIR"
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
python3 -m hybrid_engine.data prepare "$TEXT" "$RES/text.tok" --bpe $BPE || exit 1

SHAPE="--layers 4 --hidden 128 --heads 4 --seq-len 128"
RECIPE="--optimizer adamw --lr 3e-3 --lr-warmup $LR_WARMUP --lr-decay cosine --min-lr 3e-4 --weight-decay 0.1 --betas 0.9,0.95"
RECIPE="$RECIPE --clip-grad 1.0"
COMMON="--device cpu $SHAPE --batch-size 16 --micro-batches 1 --data $RES/text.tok $RECIPE --seed 0 --steps $STEPS"
COMMON="$COMMON --eval-every $EVAL_EVERY --warmup 3 --log-every 25"
declare -A MODEL=([gpt]="--model gpt" [llama]="--model llama --kv-heads 2 --ffn-hidden 384")
run() {  # name: one driver run on one CPU rank, its metrics in $RES/name.jsonl
  local name=$1 start
  start=$(date +%s)
  # --standalone: the launcher's store on a port the OS picks (the two runs go side by side)
  timeout 3600 python3 -m hybrid_engine.launch --standalone --nproc_per_node=1 hybrid_engine.py \
    ${MODEL[$name]} $COMMON --metrics "$RES/$name.jsonl" > "$RES/$name.log" 2>&1 \
    || { echo "$name FAILED"; tail -5 "$RES/$name.log"; }
  echo $(( $(date +%s) - start )) > "$RES/$name.wall"
  echo "$name: $(grep '^model:' "$RES/$name.log")"
  echo "$name: $(grep 'validation loss' "$RES/$name.log" | tail -1)"
}
run gpt &
run llama &
wait

CARD="CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), 1 thread a run, torch $(python3 -c 'import torch; print(torch.__version__)')"
DATA="$(basename "$TEXT"), $(wc -c < "$TEXT") bytes, sha256 $(sha256sum "$TEXT" | cut -c1-16)..., byte-level BPE of $BPE"
python3 experiments/analysis/llama_text_results.py --gpt "$RES/gpt.jsonl" --llama "$RES/llama.jsonl" \
  --gpt-log "$RES/gpt.log" --llama-log "$RES/llama.log" --card "$CARD" --data "$DATA" \
  --recipe "$SHAPE, 16 sequences a step, AdamW lr 3e-3, warm-up $LR_WARMUP, cosine to 3e-4, weight decay 0.1, betas 0.9,0.95, clip 1.0, seed 0, $STEPS steps, eval every $EVAL_EVERY" \
  --command "bash experiments/passes/llama_text_cpu.sh" --wall "$(cat "$RES/gpt.wall") $(cat "$RES/llama.wall")" \
  --out "$OUTDIR/$(date +%F)-llama-vs-gpt-text.json"
rc=$?
[ $rc = 0 ] && tar czf "$OUTDIR/$(date +%F)-llama-vs-gpt-text-logs.tgz" -C "$RES" --exclude text.tok .
rm -rf "$RES"
exit $rc
