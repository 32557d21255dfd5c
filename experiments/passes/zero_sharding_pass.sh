#!/usr/bin/env bash
# ZeRO levels on one 4-GPU machine, one device call (PASS_BUDGET_S, default 540 s): the 8B Llama shape (hidden 4096,
# 32 layers, 32 heads, 8 kv heads, ffn 14336, vocabulary 128256, seq 4096, 16 sequences a step, bf16, AdamW) at dp4
# with --zero 1, 2 and 3, each under --memory-cap-gib 78 (an H100's memory on an H200), then, budget allowing, the
# FSDP2 peer on the same four GPUs (../shared/anchors/fsdp2_hf_llama.py: Hugging Face's LlamaForCausalLM under
# fully_shard, eager, then compiled), then the torchtitan peer (experiments/peers/torchtitan_llama.py: torchtitan
# 0.3.0's Llama-3 under its own parallelize_llama, eager, then compiled; torchtitan and what it imports come from the
# wheels in .whl/, installed into their own folder for these runs only; a torchtitan that is missing or cannot be
# imported is said and its runs skipped). Runs go in that order; one that no longer fits the budget is skipped and said.
# A run the engine refuses (e.g. "no plan fits") or that runs out of memory is recorded as such, its error line kept.
# Every run's tokens/s, MFU and peak GiB per GPU go into one JSON: $OUT/zero_sharding.json (and the logs beside it).
#
#   bash experiments/passes/zero_sharding_pass.sh              # device kind nvidia-h100-x4 (or h200-x4)
#   NPROC=2 CAP= bash experiments/passes/zero_sharding_pass.sh   # dp2 on a 2-GPU machine, the card's own memory
#   (LEVELS="3": the zero levels to run; UNCAPPED="1": those levels without the cap; PEERS="torchtitan": the peers
#    to run, of "fsdp2 torchtitan" (the default), PEERS=0: none; PEER_RUNS="compile": only those runs of each peer
#    (FSDP2_RUNS: the FSDP2 peer's, where they differ);
#    MICRO: micro-batches, default 4; TITAN_ARGS: more flags for the torchtitan runs, e.g. "--no-cuda-graphs";
#    PLANS="auto pp4": after the levels, the planner's own choice under the cap (auto: the plan command's first row)
#    and the named plans, of auto, auto_eager (auto's with --cuda-graphs off), pp4 (interleaved v4 x 16), pp2tp2
#    (interleaved v4 x 8), tp4 (1f1b x 8), dp2pp2 (zero 1, interleaved v4 x 8: auto's plan under 78 GiB, named, so
#    that CAP= runs it on the card's own memory) and dp2pp2_graphed (the same with --cuda-graphs on: its graphed
#    peak measured where 78 GiB ran out))
#   SMOKE=1 bash experiments/passes/zero_sharding_pass.sh      # a tiny shape on 2 CPU ranks (gloo), ~1-2 minutes
#
# Expected on 4 GPUs: ~1.5 min to build, then ~1.5-2 min per engine run (model build on the meta device, 6 steps of
# ~1.5-2.5 s after 2 warm-up steps) and ~1.5 min for the eager peer: about 8 minutes; the compiled peer (~2-3 min
# with its compilation) runs only if the 9-minute budget still has room. The torchtitan runs (their first step
# autotunes torchtitan's flex attention kernels) need a call of their own: LEVELS=" " PEERS=torchtitan.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
SMOKE=${SMOKE:-0}
[[ $SMOKE == 0 || $SMOKE == 1 ]] || { echo "SMOKE must be 0 or 1, got $SMOKE"; exit 2; }
for arg in "$@"; do
  echo "zero_sharding_pass.sh takes no arguments (settings: SMOKE, PASS_BUDGET_S, OUT), got $arg"; exit 2
done
ANCHOR=${ANCHOR:-experiments/peers/fsdp2_hf_llama.py}
PEERS=${PEERS-fsdp2 torchtitan}; [[ $PEERS == 1 ]] && PEERS="fsdp2 torchtitan"; [[ $PEERS == 0 ]] && PEERS=""
for peer in $PEERS; do
  [[ $peer == fsdp2 || $peer == torchtitan ]] || { echo "PEERS takes fsdp2, torchtitan, 0 or 1, got $peer"; exit 2; }
done
peer_on() { [[ " $PEERS " == *" $1 "* ]]; }
run_on() { [[ " ${PEER_RUNS:-eager compile} " == *" $1 "* ]]; }  # eager, compile: which runs of each peer
fsdp2_on() { [[ " ${FSDP2_RUNS:-${PEER_RUNS:-eager compile}} " == *" $1 "* ]]; }  # the FSDP2 peer's, if not those

if [[ $SMOKE == 1 ]]; then
  DEADLINE=$((SECONDS + ${PASS_BUDGET_S:-540})); RESERVE=10
  OUT=${OUT:-/tmp/he_out}; RES=/tmp/zero_sharding_smoke; mkdir -p "$OUT" "$RES"
  echo cpu > "$RES/gpu.txt"
  PY=${PYTHON:-python3}
  NPROC=2; VOCAB=512
  SHAPE="--hidden 64 --layers 4 --heads 4 --kv-heads 2 --ffn-hidden 128 --seq-len 32"
  STEPS="--steps 4 --warmup 1"; BATCH=8; MICRO=2; CAP=""; DEVICE="--device cpu"
  PEER_ARGS="--cpu --hidden 64 --layers 4 --heads 4 --kv-heads 2 --ffn 128 --seq 32 --vocab $VOCAB --batch $BATCH"
  PEER_ARGS="$PEER_ARGS --micro 2 --steps 3 --warmup 1"
else
  pass_start zero_sharding
  echo "$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)" > "$RES/gpu.txt"
  PY=python3
  NPROC=${NPROC:-4}; VOCAB=128256
  SHAPE="--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --ffn-hidden 14336 --seq-len 4096"
  STEPS="--steps 8 --warmup 2"; BATCH=16; MICRO=${MICRO:-4}; CAP=${CAP---memory-cap-gib 78}; DEVICE=""
  PEER_ARGS="--batch $BATCH --micro $MICRO --steps 6 --warmup 2"
fi
write_tokens /tmp/zero_sharding_tokens.bin "$VOCAB" 4000000
L="--model llama $SHAPE --data /tmp/zero_sharding_tokens.bin --batch-size $BATCH --micro-batches $MICRO --seed 0"
L="$L --lr 3e-4 --optimizer adamw --weight-decay 0.1 --betas 0.9,0.95 --amp bf16 --dp $NPROC $STEPS $CAP $DEVICE"

engine_run() {  # name driver-args...: one engine run with its metrics file
  local name=$1; shift
  budget_run "$name" 240 $PY -m torch.distributed.run --nproc_per_node="$NPROC" hybrid_engine.py --quiet \
    --metrics "$RES/$name.jsonl" "$@" && echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}
for level in ${LEVELS:-1 2 3}; do
  if [[ " ${UNCAPPED:-} " == *" $level "* ]]; then  # the card's own memory: a peak to compare the capped ones with
    engine_run "zero${level}_uncapped" ${L/$CAP/} --zero "$level"
  else
    engine_run "zero$level" $L --zero "$level"
  fi
done
plan_flags() {  # plan: the driver flags of a named plan of the 8B shape on 4 ranks (appended to $L: the last wins)
  case $1 in
    auto)  # the plan command's first row for this machine under the cap, as the command line it prints
      $PY -m hybrid_engine.plan $SHAPE --model llama --vocab-size $VOCAB --batch-size $BATCH --amp bf16 \
        --optimizer adamw --world-size "$NPROC" $CAP $DEVICE > "$RES/plan_table.txt" 2>&1
      grep -o 'run the first: .*' "$RES/plan_table.txt" | sed 's/.*hybrid_engine.py//' ;;
    auto_eager)  # the same plan with its stages eager: the CUDA graphs' A/B beside auto (which may graph them)
      echo "$(plan_flags auto) --cuda-graphs off" ;;
    pp4)    echo "--dp 1 --pp 4 --zero 0 --schedule interleaved --virtual-stages 4 --micro-batches 16" ;;
    pp2tp2) echo "--dp 1 --pp 2 --mp 2 --zero 0 --schedule interleaved --virtual-stages 4 --micro-batches 8" ;;
    tp4)    echo "--dp 1 --mp 4 --zero 0 --schedule 1f1b --micro-batches 8" ;;
    dp2pp2) echo "--dp 2 --pp 2 --zero 1 --schedule interleaved --virtual-stages 4 --micro-batches 8 --lookahead 0 \
--no-merge-wgrad --cuda-graphs off" ;;
    dp2pp2_graphed) echo "$(plan_flags dp2pp2) --cuda-graphs on" ;;
    *) echo "PLANS takes auto, auto_eager, pp4, pp2tp2, tp4, dp2pp2, dp2pp2_graphed, got $1" >&2; return 2 ;;
  esac
}
for plan in ${PLANS:-}; do  # the planner's choice and the plans that ran out of memory on 80 GB cards, under the cap
  flags=$(plan_flags "$plan") || exit 2
  [[ -n $flags ]] || { echo "plan_$plan: the plan command chose nothing: $(tail -2 "$RES/plan_table.txt")"; continue; }
  echo "plan_$plan: $flags"
  engine_run "plan_$plan" $L $flags
done
peer_on fsdp2 || echo "PEERS=\"$PEERS\": the FSDP2 peer not run"
peer_on fsdp2 && fsdp2_on eager && budget_run fsdp2_eager 240 $PY -m torch.distributed.run --nproc_per_node="$NPROC" "$ANCHOR" $PEER_ARGS \
  && echo "fsdp2_eager: $(grep '^{' "$RES/fsdp2_eager.log" | tail -1)"
if [[ $SMOKE == 0 ]] && peer_on fsdp2 && fsdp2_on compile; then  # compiled decoder layers, last: skipped (and said) when the budget has run out
  budget_run fsdp2_compile 240 $PY -m torch.distributed.run --nproc_per_node="$NPROC" "$ANCHOR" $PEER_ARGS --compile \
    && echo "fsdp2_compile: $(grep '^{' "$RES/fsdp2_compile.log" | tail -1)"
fi

TITAN=experiments/peers/torchtitan_llama.py; TITAN_SITE=/tmp/titan_site
TITAN_WHEELS="torchtitan spmd_types tyro docstring_parser typeguard typing_extensions"  # the peer's imports' closure
titan_run() {  # name flags...: one torchtitan peer run, the wheels' folder on its PYTHONPATH only
  local name=$1; shift
  budget_run "$name" 240 env PYTHONPATH="$TITAN_SITE${PYTHONPATH:+:$PYTHONPATH}" $PY -m torch.distributed.run \
    --nproc_per_node="$NPROC" "$TITAN" $PEER_ARGS ${TITAN_ARGS:-} "$@" \
    && echo "$name: $(grep '^{' "$RES/$name.log" | tail -1)"
}
EAGER=off  # torchtitan_eager in this call: off (not asked for), ok or failed
eager_said() {  # pattern: torchtitan_eager failed in this call and its log says so
  [[ $EAGER == failed && -f "$RES/torchtitan_eager.log" ]] && grep -qiE "$1" "$RES/torchtitan_eager.log"
}
peer_on torchtitan || echo "PEERS=\"$PEERS\": the torchtitan peer not run"
if peer_on torchtitan; then
  if ls .whl/torchtitan-*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --upgrade --target "$TITAN_SITE" \
      $(for w in $TITAN_WHEELS; do ls .whl/$w-*.whl; done) > "$RES/titan_install.txt" 2>&1 \
      || echo "the torchtitan wheels did not install: $(tail -1 "$RES/titan_install.txt")"
  fi
  if ! PYTHONPATH="$TITAN_SITE${PYTHONPATH:+:$PYTHONPATH}" $PY -c "import torchtitan" 2> /dev/null; then
    echo "torchtitan is not installed (no .whl/torchtitan-*.whl): torchtitan_eager and torchtitan_compile not run"
  else
    if run_on eager; then
      if titan_run torchtitan_eager; then EAGER=ok; else EAGER=failed; fi
    fi
    if eager_said "torchtitan cannot be imported"; then
      echo "torchtitan cannot be imported (its line above): torchtitan_compile not run"
    elif [[ $SMOKE == 1 ]] || ! run_on compile; then
      :  # the compiled run: on GPUs only, and only when PEER_RUNS names it
    elif eager_said "cuda ?graph|stream ?capture|capture"; then
      echo "torchtitan_eager failed under torchtitan's CUDA-graph capture: torchtitan_compile runs with --no-cuda-graphs"
      titan_run torchtitan_compile --compile --no-cuda-graphs
    else
      titan_run torchtitan_compile --compile
    fi
  fi
fi

$PY - "$RES" <<'PY' | tee "$OUT/zero_sharding.json"
import glob, json, os, re, statistics, sys
from hybrid_engine.metrics import records
res = sys.argv[1]
rows = {}
for log in sorted(glob.glob(f"{res}/*.log")):
    name = os.path.basename(log)[:-4]
    text = open(log).read()
    rc = open(f"{res}/{name}.rc").read().strip() if os.path.exists(f"{res}/{name}.rc") else None
    row = {"exit": int(rc) if rc else None}
    if name.startswith(("zero", "plan_")):  # the engine's runs
        metrics = f"{res}/{name}.jsonl"
        steps = records.steps(records.read(metrics)) if os.path.exists(metrics) else []
        timed = steps[1:] or steps  # the first recorded step still warms up
        if timed:
            row["tokens_s"] = round(statistics.median(r["tokens_per_s"] for r in timed))
            mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
            row["mfu"] = round(statistics.median(mfu), 4) if mfu else None
            peaks = [p for r in steps for p in (r.get("peak_mem_gib") or []) if p is not None]
            row["peak_gib"] = round(max(peaks), 2) if peaks else None
            reserved = [p for r in steps for p in (r.get("peak_reserved_gib") or []) if p is not None]
            row["reserved_gib"] = round(max(reserved), 2) if reserved else None
            summary = [r["summary"] for r in records.read(metrics) if "summary" in r] if os.path.exists(metrics) else []
            if summary:
                row.update(predicted_step_s=summary[-1]["predicted_step_time_s"],
                           predicted_peak_gib=summary[-1]["predicted_peak_mem_gib"], plan=summary[-1]["plan"])
        announced = re.findall(r"^(zero 3: .*|optimizer: .*ZeRO.*)$", text, re.M)
        row["announced"] = announced[:2]
    else:
        found = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
        if found:
            row.update({k: found[-1].get(k) for k in ("tokens_s", "mfu", "peak_gib", "step_ms")})
    errors = re.findall(r"^.*(?:error: |out of memory|OutOfMemoryError|cannot be imported).*$", text, re.M)
    if errors:
        row["error"] = errors[0][:300]
    rows[name] = row
print(json.dumps({"gpu": open(f"{res}/gpu.txt").read().strip(), "runs": rows,
                  "skipped": open(f"{res}/skipped.txt").read().split() if os.path.exists(f"{res}/skipped.txt") else []},
                 indent=1))
PY
tar -czf "$OUT/zero_sharding_logs.tgz" -C "$RES" .
