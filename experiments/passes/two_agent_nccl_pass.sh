#!/usr/bin/env bash
# The 4-GPU check of the cluster launch (one device call on 4 GPUs, ~3 min): dp 2 x pp 2 with NCCL, trained
#   1. by one torchrun agent of 4 GPUs (the reference), and
#   2. by two torchrun agents of 2 GPUs each on this host (--nnodes 2, c10d rendezvous on 127.0.0.1), each told a
#      different host name (HYBRID_ENGINE_HOST=node0 / node1) and given its own two GPUs (CUDA_VISIBLE_DEVICES),
#      as two nodes of a cluster would be;
# then checks that the second run's mapping shows two hosts of two ranks each, that its communication check ran,
# and that its per-step losses equal the reference's (fp32: bit for bit expected; the largest relative difference is
# recorded). Logs and ${OUT:-/tmp/he_out}/two_agent_nccl.json (losses, differences, verdict) land in the archive
# ${OUT:-/tmp/he_out}/two_agent_nccl_pass.tgz. Run from the repository root:
#
#   bash experiments/passes/two_agent_nccl_pass.sh
#
# SMOKE=1: the same job with a tiny model on CPU (gloo), to check the script itself without GPUs.
set -uo pipefail
cd "$(dirname "$0")/../.."
source experiments/passes/pass_lib.sh
if [ "${SMOKE:-0}" = 1 ]; then OUT=${OUT:-/tmp/he_out}; RES=/tmp/two_agent_nccl; mkdir -p "$OUT" "$RES"
else pass_setup two_agent_nccl; fi
STEPS=20
MODEL="--dp 2 --pp 2 --dim 2048 --depth 8 --batch-size 256 --micro-batches 4 --steps $STEPS --warmup 3 --seed 0"
if [ "${SMOKE:-0}" = 1 ]; then
  STEPS=3
  MODEL="--dp 2 --pp 2 --dim 32 --depth 4 --batch-size 16 --micro-batches 2 --steps $STEPS --seed 0 --device cpu"
fi

timeout 300 python3 -m torch.distributed.run --nproc_per_node=4 --master_port=29511 hybrid_engine.py $MODEL --quiet \
  --metrics "$RES/single.jsonl" > "$RES/single.log" 2>&1
echo "$?" > "$RES/single.rc"

PORT=29512
for n in 0 1; do
  CUDA_VISIBLE_DEVICES=$((2 * n)),$((2 * n + 1)) HYBRID_ENGINE_HOST=node$n timeout 300 \
    python3 -m hybrid_engine.launch --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d --rdzv_id two-agents \
    --rdzv_endpoint "127.0.0.1:$PORT" hybrid_engine.py $MODEL --quiet --metrics "$RES/two_agents.jsonl" \
    > "$RES/agent$n.log" 2>&1 &
done
wait
cat "$RES"/agent*.log > "$RES/two_agents.log"

python3 - "$RES" "$OUT/two_agent_nccl.json" "$STEPS" <<'PY'
import json, re, sys
from hybrid_engine.metrics import records
res, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])

def losses(name):
    try:
        return [r["loss"] for r in records.steps(records.read(f"{res}/{name}.jsonl"))]
    except OSError:
        return []

single, two = losses("single"), losses("two_agents")
log = open(f"{res}/two_agents.log").read()
hosts = re.search(r"^ranks by host, (.*)$", log, flags=re.M)
diffs = [abs(a - b) / max(abs(a), 1e-30) for a, b in zip(single, two)]
record = {
    "single_agent_losses": single, "two_agent_losses": two,
    "mapping": hosts.group(1) if hosts else None,
    "comm_check": next((ln for ln in log.splitlines() if ln.startswith("communication check")), None),
    "max_rel_diff": max(diffs) if diffs else None,
    "bitwise_equal": bool(single) and single == two,
}
record["ok"] = (len(single) == len(two) == steps and record["max_rel_diff"] is not None
                and record["max_rel_diff"] <= 1e-6 and record["mapping"] is not None
                and record["mapping"].startswith("2 hosts:"))
json.dump(record, open(out, "w"), indent=1)
print(json.dumps({k: v for k, v in record.items() if not k.endswith("losses")}))
PY
cp "$OUT/two_agent_nccl.json" "$RES/" 2>/dev/null
tar czf "$OUT/two_agent_nccl_pass.tgz" -C "$RES" .
