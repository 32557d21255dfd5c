#!/usr/bin/env bash
# The fp32 residual stream on real text, on the CPU (no GPU needed; ~25 min on 2 cores): does --fp32-residual
# close the gap between bf16 half weights and fp32 that experiments/passes/gpt_realtext_pass.sh measured on an H100
# (4.1% at 300 steps)? A smaller GPT than the GPU run's (8 layers, hidden 128, 4 heads, seq 128, 16 sequences a
# step, BPE of 2048 on .data/python-docs.txt from experiments/bench/real_text.sh), AdamW 1e-3 clipped at 1.0, 300
# steps, validation every 25, the same seed -- the same initial weights and batches -- in three runs: fp32, bf16
# half weights, bf16 half weights with --fp32-residual. fp32 and the first bf16 run share the two cores, then
# the third runs alone. Writes experiments/results/cpu/<date>-cpu-gpt-realtext-{half-weights,fp32-residual}.json
# (experiments/analysis/realtext_results.py: each bf16 run against the fp32 one; a sub-folder, so the report, which
# compares GPUs, does not read them) and prints the two relative differences. STEPS=N for a shorter check.
set -uo pipefail
cd "$(dirname "$0")/../.."
TEXT=${TEXT:-.data/python-docs.txt}
[ -s "$TEXT" ] || { echo "error: no text at $TEXT: make it with bash experiments/bench/real_text.sh"; exit 2; }
python3 -c "import tokenizers" 2> /dev/null || { echo "error: the tokenizers package is missing (scripts/setup.sh installs it)"; exit 2; }
STEPS=${STEPS:-300}
RES=$(mktemp -d /tmp/residual_cpu.XXXX)
OUTDIR=experiments/results/cpu
mkdir -p "$OUTDIR"
export OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
python3 -m hybrid_engine.data prepare "$TEXT" "$RES/text.tok" --bpe 2048 || exit 1

SHAPE="--layers 8 --hidden 128 --heads 4 --seq-len 128 --batch-size 16 --micro-batches 1"
G="--device cpu --model gpt $SHAPE --data $RES/text.tok --optimizer adamw --lr 1e-3 --clip-grad 1.0 --seed 0"
G="$G --steps $STEPS --eval-every 25 --warmup 3 --log-every 50"
run() {  # name flags...: one driver run on one CPU rank, its metrics in $RES/name.jsonl
  local name=$1; shift
  local start
  start=$(date +%s)
  timeout 7200 torchrun --standalone --nproc_per_node=1 \
    hybrid_engine.py $G "$@" --metrics "$RES/$name.jsonl" > "$RES/$name.log" 2>&1 \
    || { echo "$name FAILED"; tail -5 "$RES/$name.log"; }
  echo $(( $(date +%s) - start )) > "$RES/$name.wall"
  echo "$name: $(grep 'validation loss' "$RES/$name.log" | tail -1)"
}
run fp32 --amp off &
run half-weights --amp bf16 &
wait
run fp32-residual --amp bf16 --fp32-residual

CARD="CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), 1 thread a run, torch $(python3 -c 'import torch; print(torch.__version__)')"
DATA="$(basename "$TEXT"), $(wc -c < "$TEXT") bytes, sha256 $(sha256sum "$TEXT" | cut -c1-16)..., byte-level BPE of 2048"
rc=0
for bf16 in half-weights fp32-residual; do
  python3 experiments/analysis/realtext_results.py --bf16 "$RES/$bf16.jsonl" --fp32 "$RES/fp32.jsonl" --card "$CARD" \
    --data "$DATA" --shape "GPT $SHAPE, AdamW lr 1e-3 (constant), clip 1.0, seed 0, $STEPS steps, eval every 25; bf16: $bf16" \
    --command "bash experiments/passes/residual_cpu_pass.sh" --wall "$(cat "$RES/$bf16.wall") $(cat "$RES/fp32.wall")" \
    --out "$OUTDIR/$(date +%F)-cpu-gpt-realtext-$bf16.json" || rc=1
done
tar czf "$OUTDIR/$(date +%F)-cpu-gpt-realtext-residual-logs.tgz" -C "$RES" --exclude text.tok .
rm -rf "$RES"
exit $rc
