#!/usr/bin/env bash
# One device call (2 GPUs, ~4-5 min; one GPU: ~6-7 min): the fp8 target's loss side -- the Llama-1B class trained
# 400 steps on a real text in bf16 and in fp8, the fp8 validation loss within 1% of bf16's after the last step.
# Device kind nvidia-h100-x2, carrying .whl (scikit-build-core for the build) and .data (the text):
#
#   python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site
#   bash experiments/passes/fp8_realtext_pass.sh
#   RECIPE=rowwise bash experiments/passes/fp8_realtext_pass.sh  # the row-wise recipe instead of the tensor-wise
#
# The text is .data/python-docs.txt (experiments/bench/real_text.sh makes it; carry .data/ to the device). Tokens: a
# byte-level BPE of 8192 trained on the whole text when the tokenizers package imports, else bytes (as
# gpt_realtext_pass.sh; TOKENIZE=bytes|bpe overrides). The model: hidden 2048, 16 layers, 32 heads, 8 kv heads, ffn
# 5632, seq 1024, RoPE theta 10000 (the Llama-1B shape of docs/performance.md at half its sequence; 0.755B parameters
# with BPE 8192, 0.723B with bytes), 16 sequences a step in 4 micro-batches (16,384 tokens; 400 steps read 6.6M
# tokens, about 2.2 passes over the ~3M training tokens of the BPE text). The recipe: AdamW lr 3e-4, STEPS / 10
# warm-up steps, cosine decay to 3e-5, weight decay 0.1 on matrices, betas 0.9,0.95, clip 1.0, seed 0 for both runs --
# the same initial weights, the same batches -- with the held-out validation loss every EVERY steps and after the
# last. Both runs: --amp bf16 (half weights, fp32 masters) --fused-kernels on, 1f1b, CUDA graphs off (the eager step,
# the path the fp8 runs of the other passes took); the second adds --fp8 --fp8-recipe $RECIPE.
#
# Two GPUs or more: the two runs side by side on GPUs 0 and 1 (each its own store); one GPU: one after the other.
# Time: the Llama-1B shape ran ~80k tokens/s on one H200 (docs/performance.md), so a run's 400 steps take ~80 s
# (~100 s on an H100), plus start-up and compiling the fused regions (not measured at this shape: ~60 s allowed);
# with the build (~90 s) and the BPE (~10 s on 2 slow cores here), ~4-5 min side by side, ~6-7 min on one GPU.
# Each run is cut by `timeout` at the pass's budget (PASS_BUDGET_S, default 560 s, less 25 s for the results; one
# GPU: the first run gets half of what is left).
#
# Out: ${OUT:-/tmp/he_out}/<date>-<n>x<card>-fp8-realtext[-rowwise].json (experiments/analysis/fp8_realtext_results.py:
# both curves, the final and largest relative difference, the target, tokens/s of each and fp8 / bf16, every run's
# command) and fp8_realtext.tgz (the logs, metrics and commands; the token file left out); a call that builds also
# leaves the built _C*.so in $OUT (pass_start: DEVICE_SO for a next call on the same tree).
#
# Knobs: STEPS (default 400), EVERY (default 50), RECIPE (tensorwise|rowwise), TEXT (default
# .data/python-docs.txt), TOKENIZE (auto|bpe|bytes). SMOKE=1 runs the same job on the CPU at a tiny shape for 8
# steps (fp8 emulated: quantized, dequantized, fp32 GEMMs), the two runs one after the other, without the build and
# without writing under experiments/results/ (tests/train/test_fp8_realtext.py runs it).
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
SMOKE=${SMOKE:-0}
STEPS=${STEPS:-$([ "$SMOKE" = 1 ] && echo 8 || echo 400)}
EVERY=${EVERY:-$([ "$SMOKE" = 1 ] && echo 4 || echo 50)}
RECIPE=${RECIPE:-tensorwise}
TEXT=${TEXT:-.data/python-docs.txt}
TOKENIZE=${TOKENIZE:-auto}
# Every bad knob is refused here, before the build and before any run.
[[ $RECIPE == tensorwise || $RECIPE == rowwise ]] \
  || { echo "error: RECIPE=$RECIPE: it must be tensorwise or rowwise"; exit 2; }
[[ $STEPS =~ ^[1-9][0-9]*$ && $EVERY =~ ^[1-9][0-9]*$ ]] \
  || { echo "error: STEPS=$STEPS, EVERY=$EVERY: both must be positive integers"; exit 2; }
[[ $TOKENIZE == auto || $TOKENIZE == bpe || $TOKENIZE == bytes ]] \
  || { echo "error: TOKENIZE=$TOKENIZE: it must be auto, bpe or bytes"; exit 2; }
[ -s "$TEXT" ] || { echo "error: no text at $TEXT: make it with bash experiments/bench/real_text.sh, carry .data/"; exit 2; }

if [ "$SMOKE" = 1 ]; then
  # smoke_start sets the budget and empties its own log folder; the CPU run keeps one thread a rank.
  smoke_start fp8_realtext 280 15
  CARD=cpu; CARD_FULL="CPU (smoke check)"; NGPU=1; DEVICE="--device cpu"; export OMP_NUM_THREADS=1
  SHAPE="--layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn-hidden 160 --seq-len 64"
  BATCH="--batch-size 8 --micro-batches 2"; LR_PEAK=3e-3; LR_MIN=3e-4; BPE_VOCAB=${BPE_VOCAB:-300}
else
  PASS_BUDGET_S=${PASS_BUDGET_S:-560} pass_start fp8_realtext
  rm -f "$RES"/*.log "$RES"/*.jsonl "$RES"/*.cmd "$RES"/*.rc "$RES"/*.wall "$RES"/realtext.tok*
  CARD_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  NGPU=$(( $(nvidia-smi -L | wc -l) >= 2 ? 2 : 1 ))
  CARD=$(grep -o 'H[0-9][0-9][0-9]' <<< "$CARD_NAME" | head -1); CARD=${CARD:-GPU}; CARD_FULL="$NGPU x $CARD_NAME"
  DEVICE=""
  SHAPE="--layers 16 --hidden 2048 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 1024"
  BATCH="--batch-size 16 --micro-batches 4"; LR_PEAK=3e-4; LR_MIN=3e-5; BPE_VOCAB=${BPE_VOCAB:-8192}
fi
CARD_FULL="$CARD_FULL, torch $(python3 -c 'import torch; print(torch.__version__)')"

TOK="$RES/realtext.tok"
real_text_tokens "$TEXT" "$TOK" || exit 1

LR_WARMUP=$(( STEPS / 10 > 0 ? STEPS / 10 : 1 ))
TIMED_WARMUP=5  # steps the driver's summary and the results' tokens/s leave out: start-up and compiling
COMMON="--model llama $SHAPE $BATCH --data $TOK --optimizer adamw --lr $LR_PEAK --min-lr $LR_MIN --lr-warmup $LR_WARMUP --lr-decay cosine"
COMMON="$COMMON --weight-decay 0.1 --betas 0.9,0.95 --clip-grad 1.0 --seed 0 --steps $STEPS --eval-every $EVERY"
COMMON="$COMMON --warmup $TIMED_WARMUP --log-every 25 --amp bf16 --fused-kernels on --schedule 1f1b --cuda-graphs off"
run() {  # name gpu limit_s flags...: one single-rank run, its command, log, metrics, exit code and wall time under
  # $RES, cut by timeout at limit_s; --standalone: torchrun's store on a port the OS picks, so side-by-side runs
  # never share or race for one
  local name=$1 gpu=$2 limit=$3 start=$SECONDS rc; shift 3
  local cmd="torchrun --standalone --nproc_per_node=1 hybrid_engine.py $DEVICE $COMMON --metrics $RES/$name.jsonl $*"
  echo "$cmd" > "$RES/$name.cmd"
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 10 "$limit" $cmd > "$RES/$name.log" 2>&1
  rc=$?
  echo "$rc" > "$RES/$name.rc"; echo $(( SECONDS - start )) > "$RES/$name.wall"
  if (( rc == 124 )); then echo "$name TIMED OUT after ${limit}s"
  elif (( rc != 0 )); then
    echo "$name FAILED (exit $rc)"; grep -E -m2 ': error: |Error: |out of memory' "$RES/$name.log" || tail -3 "$RES/$name.log"
  fi
  grep -E "validation loss|summary" "$RES/$name.log" | tail -2 | cut -c1-160 | sed "s/^/$name: /"
}
FP8="--fp8 --fp8-recipe $RECIPE"
left=$(( DEADLINE - SECONDS - RESERVE ))
(( left >= 60 )) || { echo "runs SKIPPED: ${left}s of the budget left"; exit 1; }
if (( NGPU >= 2 )); then
  echo "2 GPUs: bf16 on GPU 0 and fp8 ($RECIPE) on GPU 1 side by side, each cut at ${left}s"
  run bf16 0 "$left" &
  run fp8 1 "$left" $FP8 &
  wait
else
  gpu=$([ "$SMOKE" = 1 ] && echo "" || echo 0)
  echo "$([ "$SMOKE" = 1 ] && echo "the CPU" || echo "1 GPU"): bf16, then fp8 ($RECIPE), one after the other"
  run bf16 "$gpu" $(( left / 2 ))
  run fp8 "$gpu" $(( DEADLINE - SECONDS - RESERVE )) $FP8
fi

NAME="$(date +%F)-${NGPU}x$CARD-fp8-realtext$([ "$RECIPE" = rowwise ] && echo "-rowwise").json"
python3 experiments/analysis/fp8_realtext_results.py --bf16 "$RES/bf16.jsonl" --fp8 "$RES/fp8.jsonl" \
  --steps "$STEPS" --warmup "$TIMED_WARMUP" --card "$CARD_FULL" --data "$DATA" \
  --shape "Llama $SHAPE $BATCH, AdamW lr $LR_PEAK, warm-up $LR_WARMUP, cosine decay to $LR_MIN, weight decay 0.1,\
 betas 0.9,0.95, clip 1.0, seed 0, $STEPS steps, eval every $EVERY, bf16 half weights, fused kernels on, CUDA graphs\
 off, fp8 recipe $RECIPE" \
  --command "STEPS=$STEPS EVERY=$EVERY RECIPE=$RECIPE TOKENIZE=$TOKENIZE bash experiments/passes/fp8_realtext_pass.sh" \
  --bf16-command "$(cat "$RES/bf16.cmd")" --fp8-command "$(cat "$RES/fp8.cmd")" \
  --wall "$(cat "$RES/bf16.wall") $(cat "$RES/fp8.wall")" --out "$OUT/$NAME"
rc=$?
tar czf "$OUT/fp8_realtext.tgz" -C "$RES" --exclude realtext.tok .
[ "$SMOKE" = 1 ] && rm -rf "$RES"
echo "wrote $OUT/$NAME and $OUT/fp8_realtext.tgz after ${SECONDS}s"
exit $rc
