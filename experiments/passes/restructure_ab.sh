#!/usr/bin/env bash
# One GPU, one job: the engine before the restructure (the tree of commit 528a22a, carried as .ab/old.tar:
# `git archive -o .ab/old.tar 528a22a`) beside the current tree, on config L at pp=1: fp16 1f1b, fp16 zb1 +
# merged W, fp32 1f1b. Each (version, mode) runs twice, alternating old/new, and the faster median counts.
# Then the GPU unit tests of the current tree. Logs and a summary JSON land in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4 CMAKE_BUILD_PARALLEL_LEVEL=16
OUT=${OUT:-/tmp/he_out}; RES=/tmp/ab; mkdir -p "$OUT" "$RES" /tmp/old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RES/gpu.txt"
tar -xf .ab/old.tar -C /tmp/old
build() {  # dir: an in-place build of that tree's extension, then nothing left installed
  (cd "$1" && python3 -m pip install -q --no-build-isolation --no-deps -e . > "$RES/build-$2.log" 2>&1 \
     && python3 -m pip uninstall -y -q hybrid_engine) || { tail -30 "$RES/build-$2.log"; exit 1; }
}
build /tmp/old old; build "$PWD" new  # one at a time: each installs, then uninstalls, the editable package
L="--dim 8192 --depth 16 --batch-size 1024 --micro-batches 8 --steps 20 --warmup 6 --seed 0 --quiet"
declare -A MODES=([fp16_1f1b]="--amp fp16 --schedule 1f1b" [fp16_zb1m]="--amp fp16 --schedule zb1 --merge-wgrad"
                  [fp32_1f1b]="--schedule 1f1b")
run() {  # version dir mode round
  (cd "$2" && timeout 300 torchrun --nproc_per_node=1 hybrid_engine.py $L ${MODES[$3]} \
     --metrics "$RES/$1-$3-$4.jsonl" > "$RES/$1-$3-$4.log" 2>&1) || { echo "$1 $3 FAILED"; tail -5 "$RES/$1-$3-$4.log"; }
  echo "$1 $3 round $4: $(grep -o 'median step [0-9.]* ms' "$RES/$1-$3-$4.log")"
}
for mode in fp16_1f1b fp16_zb1m fp32_1f1b; do
  for round in 1 2; do run old /tmp/old $mode $round; run new "$PWD" $mode $round; done
done
python3 - "$RES" <<'PY' | tee "$OUT/restructure_ab.json"
import glob, json, re, sys
res = sys.argv[1]
best = {}
for path in glob.glob(f"{res}/*.log"):
    m = re.match(r".*/(old|new)-(\w+)-(\d)\.log", path)
    found = re.search(r"median step ([0-9.]+) ms", open(path).read()) if m else None
    if found:
        key = (m.group(1), m.group(2))
        best[key] = min(best.get(key, 1e9), float(found.group(1)))
gpu = open(f"{res}/gpu.txt").read().strip()
rows = {mode: {"old_ms": best.get(("old", mode)), "new_ms": best.get(("new", mode))}
        for mode in ("fp16_1f1b", "fp16_zb1m", "fp32_1f1b")}
for row in rows.values():
    if row["old_ms"] and row["new_ms"]:
        row["new_over_old"] = round(row["new_ms"] / row["old_ms"], 4)
print(json.dumps({"gpu": gpu, "config": "L pp=1 (dim 8192, depth 16, batch 1024, 8 micro-batches)",
                  "median_step_ms_best_of_2": rows}, indent=1))
PY
timeout 240 python3 -m pytest -q tests/optim/test_fused_sgd.py tests/optim/test_nonfinite_flag.py 2>&1 | tail -5 \
  | tee "$RES/pytest_gpu.txt"
tar -czf "$OUT/restructure_ab_logs.tgz" -C /tmp ab
