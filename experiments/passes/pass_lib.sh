# Sourced by the device pass scripts (tune_pass.sh, ab_pass.sh, dp_pass.sh, profile_pass.sh, gpt_pp_tp_pass.sh,
# grids_pass.sh, llama_pass.sh, plan_pass.sh, ...): the NCCL settings every GPU run keeps, the build, and the
# helpers that log one run under $RES and print its one-line result.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=4

pass_setup() {  # name: logs go to /tmp/<name>, the archive to ${OUT:-/tmp/he_out}
  OUT=${OUT:-/tmp/he_out}; RES=/tmp/$1; mkdir -p "$OUT" "$RES"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -m pip install -q --no-build-isolation --no-deps -e . > "$RES/build.log" 2>&1 \
    || { tail -40 "$RES/build.log"; exit 1; }
}

pass_start() {  # name: a budgeted pass (PASS_BUDGET_S, default 540 s; budget_run keeps to it), its logs under
  # /tmp/<name>, the card said, and the extension: DEVICE_SO (a prebuilt _C of the same tree, e.g. an earlier call's
  # left in /tmp/he_so on a warm machine or carried from its $OUT) copied in place, else built and kept for the next
  # call on this machine
  DEADLINE=$((SECONDS + ${PASS_BUDGET_S:-540}))
  RESERVE=25
  OUT=${OUT:-/tmp/he_out}; RES=/tmp/$1; mkdir -p "$OUT" "$RES"
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  if [[ -n "${DEVICE_SO:-}" ]] && ls $DEVICE_SO > /dev/null 2>&1; then
    cp $DEVICE_SO hybrid_engine/ && echo "using the prebuilt $(basename $DEVICE_SO)"
  else
    local start=$SECONDS
    CMAKE_BUILD_PARALLEL_LEVEL=48 python3 -m pip install -q --no-build-isolation --no-deps -e . \
        -Ccmake.define.HYBRID_UNITY_BUILD=OFF > "$RES/build.log" 2>&1 || { tail -40 "$RES/build.log"; exit 1; }
    echo "built in $((SECONDS - start)) s"
    local so
    so=$(python3 -c 'import hybrid_engine._C as c; print(c.__file__)')
    mkdir -p /tmp/he_so && cp "$so" /tmp/he_so/ && cp "$so" "$OUT/"
  fi
}

smoke_start() {  # name budget_s reserve_s: a pass's tiny CPU form (SMOKE=1) under its budget (PASS_BUDGET_S, else
  # budget_s), its logs under /tmp/<name>_smoke emptied first (no earlier call's run enters its results), the archive
  # to ${OUT:-/tmp/he_out}
  DEADLINE=$((SECONDS + ${PASS_BUDGET_S:-$2})); RESERVE=$3
  OUT=${OUT:-/tmp/he_out}; RES=/tmp/$1_smoke; rm -rf "$RES"; mkdir -p "$OUT" "$RES"
}

real_text_tokens() {  # text token-file: the real-text passes' tokens, a byte-level BPE of $BPE_VOCAB trained on the
  # whole text when TOKENIZE is bpe (or auto and the tokenizers package imports), else bytes; TOKENIZE is left
  # resolved and DATA says what the text and its tokens are (the results files' "data")
  local text=$1 tok=$2 tokens
  if [ "$TOKENIZE" = auto ]; then
    TOKENIZE=$(python3 -c "import tokenizers" 2> /dev/null && echo bpe || echo bytes)
  fi
  if [ "$TOKENIZE" = bpe ]; then
    python3 -m hybrid_engine.data prepare "$text" "$tok" --bpe "$BPE_VOCAB" || return 1
    tokens="byte-level BPE of $BPE_VOCAB trained on the text"
  else
    python3 -m hybrid_engine.data prepare "$text" "$tok" || return 1
    tokens="bytes"
  fi
  DATA="$(basename "$text"), $(wc -c < "$text") bytes, sha256 $(sha256sum "$text" | cut -c1-16)..., tokens: $tokens"
  DATA="$DATA; $(python3 -m hybrid_engine.data info "$tok" | sed 's/^[^:]*: //'); validation: the held-out ~1% tail"
}

budget_run() {  # name limit_s command...: logged under $RES (.cmd, .log, .rc), killed at its limit or at the pass's
  # $DEADLINE less $RESERVE seconds (a run that no longer fits is skipped, said, and listed in skipped.txt)
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS - RESERVE))
  if (( left < 25 )); then
    echo "$name SKIPPED ($left s of the budget left)"; echo "$name" >> "$RES/skipped.txt"; return 1
  fi
  (( limit > left )) && limit=$left
  echo "$*" > "$RES/$name.cmd"
  timeout -k 10 "$limit" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$RES/$name.rc"
  if (( rc == 124 )); then echo "$name TIMED OUT after ${limit}s"
  elif (( rc != 0 )); then
    echo "$name FAILED (exit $rc)"; grep -E -m2 ': error: |Error: |out of memory' "$RES/$name.log" || tail -3 "$RES/$name.log"
  fi
  return "$rc"
}

engine() {  # name nproc driver-args...: the driver with --metrics, its median step printed
  local name=$1 n=$2; shift 2
  timeout 120 torchrun --nproc_per_node="$n" hybrid_engine.py --quiet --metrics "$RES/$name.jsonl" "$@" \
    > "$RES/$name.log" 2>&1 || { echo "$name FAILED"; tail -4 "$RES/$name.log"; }
  echo "$name: $(grep -o 'median step.*' "$RES/$name.log")"
}

program() {  # name nproc script args...: a base or peer program of experiments/peers/, its samples/s printed
  local name=$1 n=$2 script=$3; shift 3
  timeout 120 torchrun --nproc_per_node="$n" "experiments/peers/$script" "$@" > "$RES/$name.log" 2>&1 \
    || { echo "$name FAILED"; tail -4 "$RES/$name.log"; }
  echo "$name: $(grep -o '"samples_s": [0-9.]*' "$RES/$name.log" | tail -1)"
}

write_tokens() {  # path vocab count: a token file of COUNT random tokens over a VOCAB-token vocabulary, drawn with
  # seed 0 (numpy's default_rng), so every pass that names the same three writes the same tokens and its runs compare
  # with earlier ones; written by the pass's Python ($PY, else $PYTHON, else python3)
  "${PY:-${PYTHON:-python3}}" - "$@" <<'PY'
import sys

import numpy as np

from hybrid_engine.data import write_token_file

path, vocab, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
write_token_file(path, np.random.default_rng(0).integers(0, vocab, count), vocab)
PY
}

gpt_tokens() {  # the GPT passes' data: 8M synthetic tokens over a 32000-token vocabulary, in /tmp/gpt_bench_tokens.bin
  write_tokens /tmp/gpt_bench_tokens.bin 32000 8000000
}

last_losses() {  # each metrics file in $RES: its last step's loss (runs that must agree are read side by side)
  for f in "$RES"/*.jsonl; do
    echo "$(basename "$f" .jsonl): last loss $(grep '"loss"' "$f" | tail -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["loss"])')"
  done
}

build_tree() {  # dir name: an in-place build of that tree's extension (kept on a warm machine), nothing left
  # installed, its log at $RES/build-<name>.log: two trees built so can run side by side from their own folders
  ls "$1"/hybrid_engine/_C*.so > /dev/null 2>&1 && return
  (cd "$1" && python3 -m pip install -q --no-build-isolation --no-deps -e . -Ccmake.define.HYBRID_UNITY_BUILD=OFF \
     > "$RES/build-$2.log" 2>&1 && cp "$(python3 -c 'import hybrid_engine._C as c; print(c.__file__)')" hybrid_engine/ \
     ; python3 -m pip uninstall -y -q hybrid_engine) || { tail -30 "$RES/build-$2.log"; exit 1; }
}

ab_trees() {  # the two trees of an A/B (the earlier commit's, carried as .ab/old.tar, in /tmp/old; this one), each
  # built in place, and the random token file both read (/tmp/ab_tokens.bin, vocabulary 32000)
  mkdir -p /tmp/old
  [[ -f /tmp/old/hybrid_engine.py ]] || tar -xf .ab/old.tar -C /tmp/old
  local start=$SECONDS
  build_tree /tmp/old old; build_tree "$PWD" new; echo "built in $((SECONDS - start)) s"
  [[ -f /tmp/ab_tokens.bin ]] || write_tokens /tmp/ab_tokens.bin 32000 8000000
}
