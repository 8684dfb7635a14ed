#!/usr/bin/env bash
# Preflight proof on a 2x H200 host, from the repo root:  bash benchmarks/gpu/preflight_gpu.sh
#   1. discover a config; validate it (fabric health included)
#   2. preflight at 1 GiB (NVLink island + node) vs a plain torch all-reduce benchmark under torchrun
#   3. the same preflight with NCCL_P2P_DISABLE=1: must be flagged below expectation (exit 1)
#   4. --record, then --expect with that record: must pass (exit 0)
#   5. plan --tp 2 --suggest-parallel, and a run whose workers read parallel_groups()
# Everything goes into ONE tarball $OUT/preflight.tgz plus the summary $OUT/preflight.txt.
# NVLink multicast stays off in every worker (the host is shared).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
L="python3 -m openclaw_launch"
SUM=$OUT/preflight.txt
SIZE=${SIZE_MIB:-1024}  # 1 GiB: the size the torchrun benchmark reports too
say() { echo "$*" | tee -a "$SUM"; }
: > "$SUM"

# The config: this host as discover writes it, with the multicast variables in every worker.
$L discover --node-name gpuhost --ip 127.0.0.1 > "$W/host.yaml" 2> "$W/discover.err"
{ cat "$W/host.yaml"
  echo "runtime:"
  echo "  nccl_env: {NCCL_NVLS_ENABLE: \"0\"}"
  echo "  env: {TORCH_SYMM_MEM_DISABLE_MULTICAST: \"1\", NVSHMEM_DISABLE_NVLS: \"1\"}"
} > "$W/cfg.yaml"
# The same with P2P off: NCCL must route through host memory, far below NVLink.
sed 's/nccl_env: {NCCL_NVLS_ENABLE: "0"}/nccl_env: {NCCL_NVLS_ENABLE: "0", NCCL_P2P_DISABLE: "1"}/' "$W/cfg.yaml" > "$W/cfg-nop2p.yaml"

say "== $(date -u) $(nvidia-smi -L | tr '\n' ' ')"
$L validate --config "$W/cfg.yaml" > "$W/validate.txt" 2>&1; say "validate: exit $?"
grep -E "nvlink_errors|pcie_link|ib_|nic_" "$W/validate.txt" | tee -a "$SUM"

pf() {  # name, expected exit, preflight args...
  local name=$1 want=$2; shift 2
  $L preflight "$@" --json --report "$W/$name-report.json" > "$W/$name.json" 2> "$W/$name.err"
  local code=$?
  say "preflight $name: exit $code (expect $want) $([ "$code" = "$want" ] && echo OK || echo MISMATCH)"
  python3 - "$W/$name.json" <<'EOF' | tee -a "$SUM"
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"  (no JSON: {e})"); sys.exit(0)
for t in d["tiers"]:
    print(f"  {t['status'].upper():<4} {t['name']:<12} busbw {t['busbw_gbps']} GB/s, expected >= {t['expected_busbw_gbps']} ({t['expected_source']}) correct={t['correct']} {t['message']}")
EOF
  [ "$code" = "$want" ] || tail -n 30 "$W/$name.err" | tee -a "$SUM"
}

pf nvlink 0 --config "$W/cfg.yaml" --size-mib "$SIZE" --iters 20
# The plain benchmark at the same size, launched by torchrun in the same run.
torchrun --standalone --nproc-per-node 2 benchmarks/gpu/allreduce.py > "$W/torchrun-allreduce.txt" 2>&1
say "torchrun allreduce.py: exit $? $(grep ALLREDUCE "$W/torchrun-allreduce.txt" | tail -1)"
python3 - "$W/nvlink.json" "$W/torchrun-allreduce.txt" <<'EOF' | tee -a "$SUM"
import json, sys
try:
    pf = {t["name"]: t["busbw_gbps"] for t in json.load(open(sys.argv[1]))["tiers"]}
    line = [l for l in open(sys.argv[2]) if l.startswith("ALLREDUCE ")][-1]
    ref = json.loads(line[len("ALLREDUCE "):])[str(1 << 30)]
    nv = pf.get("nvlink:0,1")
    print(f"  1 GiB busbw: preflight nvlink:0,1 {nv} GB/s, torchrun allreduce.py {ref} GB/s, ratio {nv / ref:.3f}")
except Exception as e:
    print(f"  comparison unavailable: {e}")
EOF

pf nop2p 1 --config "$W/cfg-nop2p.yaml" --size-mib "$SIZE" --iters 20
pf record 0 --config "$W/cfg.yaml" --size-mib "$SIZE" --iters 20 --record "$W/saved-record.json"
pf expect 0 --config "$W/cfg.yaml" --size-mib "$SIZE" --iters 20 --expect "$W/saved-record.json"

$L plan --config "$W/cfg.yaml" --tp 2 --suggest-parallel -- train.py > "$W/plan-tp2.txt" 2>&1
say "plan --tp 2 --suggest-parallel: exit $?"; tail -n 4 "$W/plan-tp2.txt" | tee -a "$SUM"
$L --config "$W/cfg.yaml" --tp 2 --telemetry off --no-python -- python3 -c \
  'import openclaw_launch as o; g = o.parallel_groups(); print("GROUPS", g.rank, g.tp_rank, g.group_of("tp"), g.init_device_mesh_args())' \
  > "$W/parallel-run.txt" 2>&1
say "run --tp 2: exit $?"; grep GROUPS "$W/parallel-run.txt" | tee -a "$SUM"
ps -eo pid,stat,cmd | awk '$2 ~ /^Z/ || /openclaw_launch[.]preflight[.]worker/' > "$W/leftovers.txt"
say "leftover workers / zombies: $(wc -l < "$W/leftovers.txt") (expect 0)"; head -n 5 "$W/leftovers.txt" | tee -a "$SUM"

cp "$SUM" "$W/"
tar -czf "$OUT/preflight.tgz" -C "$W" .
say "wrote $OUT/preflight.tgz and $SUM"
