#!/usr/bin/env bash
# Two agents on one host, one GPU each, versus one launcher for both GPUs: the 1 GiB NCCL all-reduce
# bus bandwidth of the two-agent job must be within 0.99x of the single-agent launch (issue 9).
# Run from the repo root on the 2x GPU host (the `device` tool): bash benchmarks/gpu/agents_gpu.sh
# Writes two files to $OUT: agents_gpu.txt (summary, verdict last) and agents_gpu.tar.gz (configs,
# every launcher's output, reports). NVLink multicast stays off in every worker (the host is shared).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
REPS=${REPS:-3}
W=$(mktemp -d /tmp/agents-gpu.XXXXXX); mkdir -p "$W/logs"
SUM=$OUT/agents_gpu.txt
L=(python3 -m openclaw_launch)
say() { echo "$*" | tee -a "$SUM"; }
: > "$SUM"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

{ date -u; nvidia-smi -L; nvidia-smi topo -m; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$W/host.txt" 2>&1
say "== host"; head -3 "$W/host.txt" | tee -a "$SUM"

# 1. Discover this host, then split its GPUs: node "a" gets the first, node "b" the second.
"${L[@]}" discover --node-name gpuhost --ip 127.0.0.1 > "$W/host.yaml" 2>"$W/discover.err" || { say "discover failed: $(tail -3 "$W/discover.err")"; }
python3 - "$W" <<'PY' 2>&1 | tee -a "$SUM"
import sys, yaml
w = sys.argv[1]
host = yaml.safe_load(open(f"{w}/host.yaml"))
node = host["cluster"]["nodes"][0]
gpus = node["gpus"]
if len(gpus) < 2:
    sys.exit(f"need 2 GPUs, discover found {len(gpus)}")
runtime = dict(host.get("runtime") or {})
runtime["nccl_env"] = {**runtime.get("nccl_env", {}), "NCCL_NVLS_ENABLE": "0"}
runtime["env"] = {**runtime.get("env", {}), "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
single = {**host, "cluster": {**host["cluster"], "nodes": [{**node, "gpus": gpus[:2]}]}, "runtime": runtime}
alone = [{**g, "nvlink_peers": []} for g in gpus[:2]]  # a peer on the other "node" is not this node's
two = {**host, "cluster": {**host["cluster"], "nodes": [{**node, "name": "a", "gpus": [alone[0]]}, {**node, "name": "b", "gpus": [alone[1]]}]}, "runtime": runtime}
yaml.safe_dump(single, open(f"{w}/single.yaml", "w"), sort_keys=False)
yaml.safe_dump(two, open(f"{w}/two.yaml", "w"), sort_keys=False)
print("configs: single.yaml (1 node, 2 GPUs), two.yaml (nodes a, b: 1 GPU each)")
PY
[ -s "$W/two.yaml" ] || { say "VERDICT: no configs"; tar -C "$W" -czf "$OUT/agents_gpu.tar.gz" .; exit 1; }
"${L[@]}" plan --config "$W/two.yaml" --node b -- benchmarks/gpu/allreduce.py > "$W/plan-b.txt" 2>&1

busbw() {  # the 1 GiB bus bandwidth from a launcher's output (rank 0's ALLREDUCE line)
  python3 -c 'import json,sys
for line in open(sys.argv[1]):
    if "ALLREDUCE " in line:
        print(json.loads(line.split("ALLREDUCE ", 1)[1])[str(1 << 30)]); break' "$1"
}

run_single() {
  local log=$W/logs/single-$1.txt
  timeout 300 "${L[@]}" --config "$W/single.yaml" --telemetry off --grace-period-s 5 --report "$W/logs/single-$1.json" \
    benchmarks/gpu/allreduce.py > "$log" 2>&1
  echo "exit $?" >> "$log"
  busbw "$log"
}

run_two() {
  local mp ap; mp=$(free_port); ap=$(free_port)
  local common=(--config "$W/two.yaml" --telemetry off --grace-period-s 5 --master-port "$mp" --agent-port "$ap"
    --run-id "agents-$1" --keepalive-s 15)
  timeout 300 "${L[@]}" "${common[@]}" --node a --report "$W/logs/two-$1-a.json" benchmarks/gpu/allreduce.py \
    > "$W/logs/two-$1-a.txt" 2>&1 & local pa=$!
  timeout 300 "${L[@]}" "${common[@]}" --node b --report "$W/logs/two-$1-b.json" benchmarks/gpu/allreduce.py \
    > "$W/logs/two-$1-b.txt" 2>&1 & local pb=$!
  wait $pa; echo "exit $?" >> "$W/logs/two-$1-a.txt"
  wait $pb; echo "exit $?" >> "$W/logs/two-$1-b.txt"
  busbw "$W/logs/two-$1-a.txt"
}

say "== 1 GiB all-reduce bus bandwidth, GB/s (interleaved, $REPS reps each)"
singles=() twos=()
for i in $(seq 1 "$REPS"); do
  s=$(run_single "$i"); t=$(run_two "$i")
  say "rep $i: single agent ${s:-FAILED}   two agents ${t:-FAILED}"
  [ -n "$s" ] && singles+=("$s"); [ -n "$t" ] && twos+=("$t")
done
python3 - "${#singles[@]}" "${singles[@]}" "${twos[@]}" <<'PY' 2>&1 | tee -a "$SUM"
import statistics, sys
n = int(sys.argv[1]); s = [float(x) for x in sys.argv[2:2 + n]]; t = [float(x) for x in sys.argv[2 + n:]]
if not s or not t:
    print("VERDICT: FAIL (a run gave no number; see the logs in agents_gpu.tar.gz)")
    sys.exit(1)
ms, mt = statistics.median(s), statistics.median(t)
ratio = mt / ms
print(f"median single {ms:.2f} GB/s, two agents {mt:.2f} GB/s, ratio {ratio:.4f}")
print(f"VERDICT: {'PASS' if ratio >= 0.99 else 'FAIL'} (two agents within 0.99x of one launcher: {ratio:.4f})")
PY
say "== job report of the last two-agent run (first node)"
cat "$W/logs/two-$REPS-a.txt" | grep -A6 "job report" | tee -a "$SUM"
say "== leftovers (expect none)"; ps -eo pid,stat,cmd | grep -E "allreduce.py|openclaw_launch" | grep -v grep | tee -a "$SUM"
tar -C "$W" -czf "$OUT/agents_gpu.tar.gz" .
rm -rf "$W"
