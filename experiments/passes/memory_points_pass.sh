#!/usr/bin/env bash
# Peak memory of the planner's calibration points on one GPU each (tests/planner/test_memory_model.py reads the
# result): the MLP configs L and C (fp16) and the GPT-1B shape under 1f1b and zb1 + merged W, and the Llama-1B
# shape (fused kernels off, as the planner's model counts it) at 4 and 8 micro-batches. Four runs at a time, one per
# GPU, 4 steps each (the peak is the run's, warm-up included); each run's torch.cuda.max_memory_allocated per rank and
# the planner's prediction go into $OUT/<date>-1x<card>-memory-points.json.
#
#   bash experiments/passes/memory_points_pass.sh     # any 4-GPU kind (PASS_BUDGET_S, default 300 s; GPUS=1 on one)
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PASS_BUDGET_S=${PASS_BUDGET_S:-300} pass_start memory_points
gpt_tokens
GPUS=${GPUS:-4}
S="--steps 4 --warmup 1 --seed 0"
L="--dim 8192 --depth 16 --batch-size 1024 --amp fp16 $S"
C="--dim 8192 --depth 8 --batch-size 64 --amp fp16 $S"
G="--model gpt --hidden 2048 --layers 16 --heads 16 --seq-len 2048 --data /tmp/gpt_bench_tokens.bin --batch-size 16 --amp bf16 $S"
G="$G --fused-kernels off"
M="--model llama --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048 --batch-size 16"
M="$M --data /tmp/gpt_bench_tokens.bin --amp bf16 --optimizer adamw --fused-kernels off $S"
ZB="--schedule zb1 --merge-wgrad"
POINTS=(
  "L_1f1b_m1|$L --schedule 1f1b --micro-batches 1" "L_1f1b_m8|$L --schedule 1f1b --micro-batches 8"
  "C_1f1b_m1|$C --schedule 1f1b --micro-batches 1" "G_1f1b_m1|$G --schedule 1f1b --micro-batches 1"
  "G_1f1b_m4|$G --schedule 1f1b --micro-batches 4" "G_1f1b_m8|$G --schedule 1f1b --micro-batches 8"
  "llama1b_1f1b_m8|$M --schedule 1f1b --micro-batches 8" "llama1b_1f1b_m4|$M --schedule 1f1b --micro-batches 4"
  "L_zb1merged_m4|$L $ZB --micro-batches 4" "C_zb1merged_m4|$C $ZB --micro-batches 4"
  "G_zb1merged_m4|$G $ZB --micro-batches 4" "L_1f1b_m4|$L --schedule 1f1b --micro-batches 4"
)
for ((i = 0; i < ${#POINTS[@]}; i += GPUS)); do
  for ((g = 0; g < GPUS && i + g < ${#POINTS[@]}; g++)); do
    name=${POINTS[i + g]%%|*}; flags=${POINTS[i + g]#*|}
    (export CUDA_VISIBLE_DEVICES=$g; budget_run "$name" 120 torchrun --nproc_per_node=1 --master_port=$((29600 + g)) \
      hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" $flags) &
  done
  wait
done
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
SHORT=$(grep -o 'H[0-9]00' <<< "$CARD" | head -1)
python3 - "$RES" "$CARD" > "$OUT/$(date +%F)-1x${SHORT:-gpu}-memory-points.json" <<'PY'
import glob, json, os, re, sys
res, card = sys.argv[1:]
runs = {}
for log in sorted(glob.glob(f"{res}/*.log")):
    name, text = os.path.basename(log)[:-4], open(log).read()
    peak = re.search(r"peak memory per rank \(GiB\) \[([0-9.]+)\]", text)
    predicted = re.search(r"peak [0-9.]+ GiB \(predicted ([0-9.]+)\)", text)
    if os.path.exists(f"{res}/{name}.cmd"):
        runs[name] = {"flags": open(f"{res}/{name}.cmd").read().split("hybrid_engine.py", 1)[-1].strip(),
                      "peak_mem_gib": float(peak.group(1)) if peak else None,
                      "predicted_gib": float(predicted.group(1)) if predicted else None}
print(json.dumps({"card": card, "runs": runs}, indent=1))
PY
cat "$OUT"/*-memory-points.json | python3 -c "import json,sys; [print(k, v['peak_mem_gib'], v['predicted_gib']) for k, v in json.load(sys.stdin)['runs'].items()]"
tar -czf "$OUT/memory_points_logs.tgz" -C "$RES" .
