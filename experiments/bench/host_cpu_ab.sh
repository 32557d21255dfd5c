#!/usr/bin/env bash
# Host CPU of a tensor- and pipeline-parallel step on CPU ranks, two checkouts side by side: a tiny GPT (hidden 64,
# 8 layers, seq 64, 8 micro-batches) on pp2 x mp2 (4 gloo ranks), where the arithmetic is small and the host's
# work per layer shows. Each tree runs 5 and 45 steps; the difference of the two runs' user CPU seconds is 40
# steps' host CPU, without start-up. Rounds alternate the trees.
#
#   bash experiments/bench/host_cpu_ab.sh OLD_TREE OLD_PYTHON NEW_TREE NEW_PYTHON [ROUNDS]
set -euo pipefail
OLD=$1 OLD_PY=$2 NEW=$3 NEW_PY=$4 ROUNDS=${5:-2}
DATA=$(mktemp -d)/tokens.bin
"$NEW_PY" - "$DATA" <<'PY'
import sys
import numpy as np
from hybrid_engine.data import write_token_file
write_token_file(sys.argv[1], np.random.default_rng(0).integers(0, 512, 400_000), 512)
PY
ARGS="--model gpt --hidden 64 --layers 8 --heads 4 --seq-len 64 --data $DATA --batch-size 16 --micro-batches 8
      --schedule 1f1b --quiet --optimizer adamw --lr 3e-4 --mp 2 --pp 2 --warmup 2"
user_s() {  # tree python steps: the user CPU seconds of the whole job
  (cd "$1" && OMP_NUM_THREADS=1 /usr/bin/time -f "%U" "$2" -m torch.distributed.run --nproc_per_node=4 \
     --master_port=$((20000 + RANDOM % 20000)) hybrid_engine.py $ARGS --steps "$3" 2>&1 > /dev/null | tail -1)
}
for round in $(seq "$ROUNDS"); do
  for tree in old new; do
    dir=$OLD py=$OLD_PY; [[ $tree == new ]] && dir=$NEW py=$NEW_PY
    short=$(user_s "$dir" "$py" 5) long=$(user_s "$dir" "$py" 45)
    echo "{\"round\": $round, \"tree\": \"$tree\", \"host_cpu_s_per_40_steps\": $(python3 -c "print(round($long - $short, 2))")}"
  done
done
