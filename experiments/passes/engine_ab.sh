#!/usr/bin/env bash
# The engine before and after a change of its shape, side by side in one job on one 4-GPU machine: the tree of an
# earlier commit (carried as .ab/old.tar: `mkdir -p .ab && git archive -o .ab/old.tar <commit> -- . ':!report'
# ':!experiments/results'`) beside the current tree, on the Llama and the GPT of the Llama and grids passes:
#
#   PHASE=llama  hidden 2048, 16 layers, 32/8 heads, ffn 5632, seq 2048, 16 sequences in 8 micro-batches, bf16
#   PHASE=gpt    hidden 2560, 12 layers, 20 heads, seq 1024, 32 sequences in 8 micro-batches, bf16
#
# STEPS (default 16) steps of which WARMUP (5) are not timed, each on one GPU, pp2 x tp2, tp4 and pp4 (1f1b, the schedule named so that both trees run the same plan), old and
# new alternating (REPEAT="pp4 tp4": new and old once more on those grids), the two one-GPU runs side by side on GPUs 0 and 1; then, new tree only, one GPU with --compile
# beside its eager run (the Llama phase). Every run's median step goes to $OUT/engine_ab_<phase>.json with new/old.
# NEW_ARGS: flags given to the new tree's runs only (a feature the old tree lacks, e.g. "--fused-kernels off").
#
#   PHASE=llama bash experiments/passes/engine_ab.sh      # device kind nvidia-h100-x4, carry .ab
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
PHASE=${PHASE:-llama}
[[ $PHASE == llama || $PHASE == gpt ]] || { echo "PHASE must be llama or gpt, got $PHASE"; exit 2; }
export CMAKE_BUILD_PARALLEL_LEVEL=48
OUT=${OUT:-/tmp/he_out}; RES=/tmp/engine_ab_$PHASE; mkdir -p "$OUT" "$RES"
DEADLINE=$((SECONDS + ${PASS_BUDGET_S:-560})); RESERVE=20
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RES/gpu.txt"
ab_trees
RUN="--data /tmp/ab_tokens.bin --micro-batches 8 --steps ${STEPS:-16} --warmup ${WARMUP:-5} --seed 0 --lr 3e-4 --amp bf16 --schedule 1f1b"
if [[ $PHASE == llama ]]; then
  M="--model llama --hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn-hidden 5632 --seq-len 2048"
  M="$M --batch-size 16 --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 $RUN"
else
  M="--model gpt --hidden 2560 --layers 12 --heads 20 --seq-len 1024 --batch-size 32 --optimizer adamw $RUN"
fi

run() {  # version name gpus first-gpu driver-args...: one run of a tree, from its own folder
  local version=$1 name=$2 n=$3 first=$4; shift 4
  local dir=$PWD extra=(); [[ $version == old ]] && dir=/tmp/old
  [[ $version == new ]] && read -ra extra <<< "${NEW_ARGS:-}"  # flags only the new tree takes (e.g. --fused-kernels off)
  local left=$((DEADLINE - SECONDS - RESERVE))
  (( left < 30 )) && { echo "$version-$name SKIPPED"; return; }
  local devices; devices=$(seq -s, "$first" $((first + n - 1)))
  (cd "$dir" && CUDA_VISIBLE_DEVICES=$devices timeout -k 5 $(( left < 200 ? left : 200 )) torchrun \
     --nproc_per_node="$n" --master_port=$((29500 + first)) hybrid_engine.py --quiet \
     --metrics "$RES/$version-$name.jsonl" "$@" "${extra[@]}" > "$RES/$version-$name.log" 2>&1) \
    || { echo "$version-$name FAILED"; grep -E -m2 'rror|out of memory' "$RES/$version-$name.log"; }
}
pair() {  # name gpus driver-args...: only grids GRIDS names (default: all);: old then new on the same GPUs (one-GPU runs: side by side on GPUs 0 and 1);
  # for a grid REPEAT names, then new and old again (name_2): a drift of the machine over the pair shows as a disagreement
  local name=$1 n=$2; shift 2
  [[ -z ${GRIDS:-} || " $GRIDS " == *" $name "* ]] || return 0
  if (( n == 1 )); then
    run old "$name" 1 0 "$@" & run new "$name" 1 1 "$@"; wait
  else
    run old "$name" "$n" 0 "$@"; run new "$name" "$n" 0 "$@"
    [[ " ${REPEAT:-} " == *" $name "* ]] && { run new "${name}_2" "$n" 0 "$@"; run old "${name}_2" "$n" 0 "$@"; }
  fi
  echo "$name: old $(grep -ho 'median step [0-9.]* ms' "$RES"/old-$name*.log | tr '\n' ' ')| new $(grep -ho 'median step [0-9.]* ms' "$RES"/new-$name*.log | tr '\n' ' ')"
}
pair 1gpu 1 $M
if [[ $PHASE == llama && -z ${GRIDS:-} ]]; then
  run new 1gpu_eager 1 0 $M & run new 1gpu_compile 1 1 $M --compile; wait
  echo "compile: eager $(grep -o 'median step [0-9.]* ms' "$RES/new-1gpu_eager.log") | compiled $(grep -o 'median step [0-9.]* ms' "$RES/new-1gpu_compile.log")"
fi
pair pp2tp2 4 $M --pp 2 --mp 2
pair pp4 4 $M --pp 4
pair tp4 4 $M --mp 4
[[ " ${GRIDS:-} " == *" tp2 "* ]] && pair tp2 2 $M --mp 2  # on a 2-GPU machine, named only

python3 - "$RES" "$PHASE" <<'PY' | tee "$OUT/engine_ab_$PHASE.json"
import glob, json, os, re, sys
res, phase = sys.argv[1:]
steps = {}
for path in glob.glob(f"{res}/*.log"):
    found = re.search(r"median step ([0-9.]+) ms", open(path).read())
    if found:
        steps[os.path.basename(path)[:-4]] = float(found.group(1))
rows = {}
for grid in ("1gpu", "pp2tp2", "tp4", "pp4", "tp2"):
    for run in (grid, f"{grid}_2"):
        old, new = steps.get(f"old-{run}"), steps.get(f"new-{run}")
        if old or new:
            rows[run] = {"old_ms": old, "new_ms": new, "old_over_new": round(old / new, 4) if old and new else None}
if phase == "llama":
    eager, compiled = steps.get("new-1gpu_eager"), steps.get("new-1gpu_compile")
    rows["compile_1gpu"] = {"eager_ms": eager, "compile_ms": compiled,
                            "eager_over_compile": round(eager / compiled, 4) if eager and compiled else None}
print(json.dumps({"gpu": open(f"{res}/gpu.txt").read().strip(), "phase": phase,
                  "median_step_ms": rows, "speed_new_over_old": "old_over_new > 1: the new tree is faster"},
                 indent=1))
PY
tar -czf "$OUT/engine_ab_${PHASE}_logs.tgz" -C "$RES" .
