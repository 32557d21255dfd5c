#!/usr/bin/env bash
# One device call (~6 min, 1 GPU): the GPT issue's real-text target -- 300 steps on a real text file, bf16 and
# fp32 validation losses agree within 1%. The text is .data/python-docs.txt (experiments/bench/real_text.sh makes it;
# carry .data/ to the device). Tokens: a byte-level BPE of 8192 when the tokenizers package imports, else bytes
# (the device machines have no tokenizers and no network: bytes). A GPT of 8 layers, hidden 512, 8 heads, seq 512,
# 64 sequences in 2 micro-batches per step, AdamW 6e-4 clipped at 1.0, trains 300 steps in bf16 (half weights, fp32
# masters) and again in fp32 with the same seed -- the same initial weights, the same batches -- with the held-out
# validation loss every 25 steps. Writes ${OUT:-/tmp/he_out}/<date>-1x<card>-gpt-realtext.json (both curves, the
# final relative difference, tokens/s; experiments/analysis/realtext_results.py) and a copy in experiments/results/, and
# the logs in $OUT/gpt_realtext.tgz.
#
# SMOKE=1 runs the same job on the CPU at a tiny shape for a few steps, without the build and without touching
# experiments/results/ (the script's own check; tests/train/test_realtext.py runs it). TEXT=FILE reads another text;
# TOKENIZE=bytes|bpe overrides the choice (default auto: bpe when tokenizers imports).
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
TEXT=${TEXT:-.data/python-docs.txt}
[ -s "$TEXT" ] || { echo "error: no text at $TEXT: make it with bash experiments/bench/real_text.sh, carry .data/"; exit 2; }
if [ "${SMOKE:-0}" = 1 ]; then
  OUT=${OUT:-/tmp/he_out}; RES=$(mktemp -d /tmp/gpt_realtext_smoke.XXXX); mkdir -p "$OUT"
  CARD=cpu; CARD_FULL="CPU (smoke check)"; DEVICE=(--device cpu); export OMP_NUM_THREADS=1
  RUN="--layers 2 --hidden 32 --heads 2 --seq-len 32 --batch-size 8 --micro-batches 2"
  STEPS=6; EVERY=3; BPE_VOCAB=${BPE_VOCAB:-300}
else
  pass_setup gpt_realtext
  CARD_FULL="1 x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  CARD=$(echo "$CARD_FULL" | grep -o 'H[0-9][0-9][0-9]' | head -1); CARD=${CARD:-GPU}; DEVICE=()
  RUN="--layers 8 --hidden 512 --heads 8 --seq-len 512 --batch-size 64 --micro-batches 2"
  STEPS=300; EVERY=25; BPE_VOCAB=${BPE_VOCAB:-8192}
fi
CARD_FULL="$CARD_FULL, torch $(python3 -c 'import torch; print(torch.__version__)')"

TOK="$RES/realtext.tok"
TOKENIZE=${TOKENIZE:-auto}
real_text_tokens "$TEXT" "$TOK" || exit 1

G="--model gpt $RUN --data $TOK --optimizer adamw --lr 6e-4 --clip-grad 1.0 --seed 0"
G="$G --steps $STEPS --eval-every $EVERY --warmup 3 --log-every 25"
WALL=""
# AMP_IMPL=autocast: the bf16 run keeps fp32 weights and casts per matrix product (--amp-impl autocast), to tell
# the half-weight step's rounding from bf16's own
AMP_IMPL=${AMP_IMPL:-half-weights}
# FP32_RESIDUAL=1: the bf16 half-weight run keeps its residual stream in fp32 (--fp32-residual), the fix the
# first measurement pointed at (NOTES)
FP32_RESIDUAL=${FP32_RESIDUAL:-0}
RESIDUAL_FLAG=$([ "$FP32_RESIDUAL" = 1 ] && echo "--fp32-residual")
for prec in bf16 fp32; do
  amp=$([ $prec = fp32 ] && echo off || echo $prec)
  impl=$([ $prec = fp32 ] || echo "--amp-impl $AMP_IMPL $RESIDUAL_FLAG")
  start=$(date +%s)
  timeout 240 torchrun --nproc_per_node=1 hybrid_engine.py "${DEVICE[@]}" $G --amp "$amp" $impl \
    --metrics "$RES/$prec.jsonl" > "$RES/$prec.log" 2>&1 || { echo "$prec FAILED"; tail -8 "$RES/$prec.log"; }
  WALL="$WALL $(( $(date +%s) - start ))"
  grep -E "validation loss|summary" "$RES/$prec.log" | tail -2 | sed "s/^/$prec: /"
done

NAME="$(date +%F)-1x$CARD-gpt-realtext$([ "$AMP_IMPL" = half-weights ] || echo "-$AMP_IMPL")"
NAME="$NAME$([ "$FP32_RESIDUAL" = 1 ] && echo "-fp32-residual").json"
python3 experiments/analysis/realtext_results.py --bf16 "$RES/bf16.jsonl" --fp32 "$RES/fp32.jsonl" --card "$CARD_FULL" \
  --data "$DATA" --shape "GPT $RUN, AdamW lr 6e-4 (constant), clip 1.0, seed 0, $STEPS steps, eval every $EVERY" \
  --command "AMP_IMPL=$AMP_IMPL FP32_RESIDUAL=$FP32_RESIDUAL bash experiments/passes/gpt_realtext_pass.sh" --wall "$WALL" --out "$OUT/$NAME"
rc=$?
[ "${SMOKE:-0}" = 1 ] || { [ $rc = 0 ] && cp "$OUT/$NAME" experiments/results/; }
tar czf "$OUT/gpt_realtext.tgz" -C "$RES" --exclude realtext.tok .
[ "${SMOKE:-0}" = 1 ] && rm -rf "$RES"
exit $rc
