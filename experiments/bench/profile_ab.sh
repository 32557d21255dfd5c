#!/usr/bin/env bash
# Where two trees' GPU steps differ: the tree of an earlier commit (carried as .ab/old.tar, see
# experiments/passes/engine_ab.sh) and the current tree run the same GPT on the same GPUs, first timed plainly
# (old, new, new, old: a drift of the machine shows as a disagreement), then each once under torch.profiler
# (experiments/bench/profile_driver.py). compare_profiles.py prints the operators and kernels whose calls or
# self time differ most, and each run's GPU-busy time beside its wall time.
#
#   GRID="--mp 2" GPUS=2 bash experiments/bench/profile_ab.sh     # device kind nvidia-h100-x2, carry .ab .whl
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
export CMAKE_BUILD_PARALLEL_LEVEL=32
GRID=${GRID:---mp 2}; GPUS=${GPUS:-2}
OUT=${OUT:-/tmp/he_out}; RES=/tmp/profile_ab; mkdir -p "$OUT" "$RES"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RES/gpu.txt"
ab_trees
M="--model gpt --hidden 2560 --layers 12 --heads 20 --seq-len 1024 --batch-size 32 --optimizer adamw
   --data /tmp/ab_tokens.bin --micro-batches 8 --seed 0 --lr 3e-4 --amp bf16 --schedule 1f1b --quiet $GRID"
run() {  # tree name script extra...: one run from the tree's own folder
  local tree=$1 name=$2 script=$3; shift 3
  local dir=$PWD; [[ $tree == old ]] && dir=/tmp/old
  (cd "$dir" && PROFILE_OUT=$RES/$tree timeout -k 5 150 torchrun --nproc_per_node="$GPUS" "$script" $M "$@" \
     > "$RES/$tree-$name.log" 2>&1) || { echo "$tree-$name FAILED"; tail -5 "$RES/$tree-$name.log"; }
  echo "$tree-$name: $(grep -o 'median step [0-9.]* ms' "$RES/$tree-$name.log")"
}
for round in 1 2; do
  first=old second=new; (( round == 2 )) && first=new second=old
  run $first "timed$round" hybrid_engine.py --steps 16 --warmup 5
  run $second "timed$round" hybrid_engine.py --steps 16 --warmup 5
done
PROFILER=$PWD/experiments/bench/profile_driver.py
run old profiled "$PROFILER" --steps 6 --warmup 3
run new profiled "$PROFILER" --steps 6 --warmup 3
python3 experiments/bench/compare_profiles.py "$RES/old-rank0.json" "$RES/new-rank0.json" 45 | tee "$OUT/profile_ab.txt"
grep -ho 'median step [0-9.]* ms' "$RES"/*timed*.log > /dev/null && for f in "$RES"/*timed*.log; do
  echo "$(basename "$f" .log): $(grep -o 'median step [0-9.]* ms' "$f")"; done | tee -a "$OUT/profile_ab.txt"
cp "$RES"/old-rank0.json "$OUT/profile_old_rank0.json"; cp "$RES"/new-rank0.json "$OUT/profile_new_rank0.json"
tar -czf "$OUT/profile_ab_logs.tgz" -C "$RES" --exclude='*.json' .
