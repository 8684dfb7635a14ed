#!/usr/bin/env bash
# The GPU-host start path (issue 16), on the lent 1-GPU H200 host, from the repo root:
#   bash benchmarks/gpu/start_path.sh
# 1. copies the tree to a writable directory and compiles its bytecode (as an installed package has it);
# 2. discover (each lease hands out another GPU) and the host's facts: the driver's /proc GPUs beside
#    NVML's, how long each takes, whether `plan` imports pynvml (python -X importtime);
# 3. benchmarks/launcher_overhead.py, openclaw-launch (`python3 -m openclaw_launch`, default options)
#    vs torchrun --standalone vs the floor launcher, REPS runs each, medians:
#    N=1 launch / clean exit / footprint; N=2 launch / clean exit / failure teardown (both ranks on the
#    one GPU: openclaw-launch with procs_per_gpu 2 under its own MPS daemon; MPS=0 skips N=2);
#    and N=1 launch with --telemetry off beside the default (where the start time goes);
# 4. where openclaw-launch's start goes: benchmarks/start_timeline.py (imports, forks, spawns, the
#    worker's start), beside the floor's;
# 5. summary.txt / summary.json under $OUT: the medians and the issue's ratios against their goals;
#    every other output in $OUT/start_path.tgz.
# NVLink multicast stays off in every worker. No GPU setting is changed; every step is time-bounded;
# at the end no launcher, worker or MPS process may be left (listed in summary.txt if one is).
# Without an NVIDIA GPU (this script's own test on a CPU box) the same runs with CPU workers, no MPS.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
REPS=${REPS:-3}; FOOTPRINT_S=${FOOTPRINT_S:-8}; MPS=${MPS:-1}
PY=${PYTHON:-python3}
W=$(mktemp -d /tmp/start-path.XXXXXX); trap 'rm -rf "$W"' EXIT
LOG=$OUT/start_path.log; : > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
bounded() { local s=$1; shift; timeout -k 10 "$s" "$@"; }  # never hang the lease

# 1. a writable, compiled copy: without bytecode every start compiles ~30 modules (+160 ms)
cp -r openclaw_launch benchmarks "$W"/ && bounded 120 "$PY" -m compileall -q "$W/openclaw_launch" "$W/benchmarks" \
  || { say "compileall failed"; exit 1; }
export PYTHONPATH=$W
L="$PY -m openclaw_launch"
GPU=0; ls /proc/driver/nvidia/gpus/*/information > /dev/null 2>&1 && command -v nvidia-smi > /dev/null && GPU=1
say "== $(date -u) host $(hostname), $(nproc) cores, $($PY --version 2>&1), gpu=$GPU, reps=$REPS"

# 2. the host
{
  if [ "$GPU" = 1 ]; then nvidia-smi -L; head -1 /proc/driver/nvidia/version; cat /proc/driver/nvidia/gpus/*/information; fi
  echo "== discover"; bounded 60 $L discover --node-name gpuhost --ip 127.0.0.1; echo "exit $?"
} > "$OUT/host.txt" 2>&1
bounded 60 $L discover --node-name gpuhost --ip 127.0.0.1 > "$W/host.yaml" 2>> "$LOG"
bounded 60 $L discover --snapshot > "$OUT/snapshot.json" 2>> "$LOG"
# the driver's files vs NVML, each timed in a fresh interpreter (pynvml's import included)
for source in procfs nvml; do
  bounded 60 "$PY" - "$source" > "$OUT/topology-$source.json" 2>> "$LOG" <<'PY'
import json, sys, time
t0 = time.perf_counter()
from openclaw_launch.topology.live import discover_topology
topo = discover_topology(nvml_facts=sys.argv[1] == "nvml")
gpus = [dict(index=g.index, uuid=g.uuid, bus=g.pci_bus_id, name=g.name, numa=g.numa_node, cpus=len(g.cpu_affinity or ()))
        for g in topo.gpus]
print(json.dumps(dict(source=sys.argv[1], seconds=round(time.perf_counter() - t0, 4), gpus=gpus,
                      links=len(topo.links), pynvml_imported="pynvml" in sys.modules)))
PY
done
bounded 60 "$PY" -X importtime -m openclaw_launch plan --json --nproc-per-node 1 train.py > "$OUT/plan.json" 2> "$W/importtime.txt"
grep -E "pynvml|openclaw_launch.topology|click$" "$W/importtime.txt" > "$OUT/plan-importtime.txt"
echo "pynvml imported by plan: $(grep -q pynvml "$W/importtime.txt" && echo yes || echo no)" | tee -a "$LOG"

# 3. the launcher overhead harness
OPENCLAW_N2="$L --nproc-per-node {n}"
if [ "$GPU" = 1 ] && [ "$MPS" = 1 ]; then  # two ranks on the one GPU need MPS (NCCL refuses two on one GPU)
  { cat "$W/host.yaml"
    echo "runtime:"
    echo "  procs_per_gpu: 2"
    echo "  enable_mps: true"
    echo "  mps_max_clients_per_gpu: 2"
    echo "  nccl_env: {NCCL_NVLS_ENABLE: \"0\"}"
    echo "  env: {TORCH_SYMM_MEM_DISABLE_MULTICAST: \"1\", NVSHMEM_DISABLE_NVLS: \"1\"}"
  } > "$W/mps2.yaml"
  OPENCLAW_N2="$L --config $W/mps2.yaml"
fi
H="$PY $W/benchmarks/launcher_overhead.py --timeout 60 --orphan-grace 2"
bench() {  # name, seconds, harness args...
  local name=$1 s=$2; shift 2
  say "-- $name"
  bounded "$s" $H "$@" --json "$OUT/$name.json" > "$OUT/$name.txt" 2>> "$LOG"; say "   exit $?"
}
bench n1 300 --nprocs 1 --reps "$REPS" --scenarios launch,clean,footprint --footprint-seconds "$FOOTPRINT_S" \
  --launcher 'torchrun --standalone --nproc-per-node {n}' --name torchrun \
  --launcher "$L --nproc-per-node {n}" --name openclaw \
  --launcher null --name floor
if [ "$GPU" = 0 ] || [ "$MPS" = 1 ]; then
  bench n2 240 --nprocs 2 --reps "$REPS" --scenarios launch,clean,failure \
    --launcher 'torchrun --standalone --nproc-per-node {n}' --name torchrun \
    --launcher "$OPENCLAW_N2" --name openclaw \
    --launcher null --name floor
fi
bench n1-telemetry 120 --nprocs 1 --reps $((REPS + 2)) --scenarios launch \
  --launcher "$L --nproc-per-node {n}" --name openclaw \
  --launcher "$L --telemetry off --nproc-per-node {n}" --name openclaw-telemetry-off \
  --launcher null --name floor

# 4. the start, milestone by milestone
for t in "openclaw:$L --nproc-per-node 1" "openclaw-telemetry-off:$L --telemetry off --nproc-per-node 1" \
         "floor:$PY $W/benchmarks/launcher_overhead.py null-launcher --nproc 1"; do
  name=${t%%:*}
  bounded 120 "$PY" "$W/benchmarks/start_timeline.py" --reps $((REPS + 2)) --json "$OUT/timeline-$name.json" -- ${t#*:} \
    > "$OUT/timeline-$name.txt" 2>> "$LOG"
done

# 5. medians and ratios
"$PY" - "$OUT" "$GPU" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import json, os, sys
out, gpu = sys.argv[1], sys.argv[2] == "1"
def load(name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return json.load(f)["summary"]
    except (OSError, ValueError, KeyError):
        return {}
def med(s, who, key, n):
    return s.get(who, {}).get(key, {}).get(str(n), {}).get("median")
def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None
rows, goals = [], []
for name, n in (("n1", 1), ("n2", 2), ("n1-telemetry", 1)):
    s = load(name)
    for key in ("launch_last_s", "clean_exit_s", "fail_teardown_s", "fp_rss_peak_mib", "fp_rss_hwm_mib", "fp_threads"):
        vals = {who: med(s, who, key, n) for who in s}
        if any(v is not None for v in vals.values()):
            rows.append(dict(run=name, n=n, metric=key, **vals,
                             openclaw_vs_floor=ratio(vals.get("openclaw"), vals.get("floor")),
                             openclaw_vs_torchrun=ratio(vals.get("openclaw"), vals.get("torchrun"))))
def find(run, metric):
    return next((r for r in rows if r["run"] == run and r["metric"] == metric), {})
for what, row, field, limit in (
    ("exec -> last worker, N=1, openclaw / floor", find("n1", "launch_last_s"), "openclaw_vs_floor", 2.0),
    ("clean exit, N=1, openclaw / floor", find("n1", "clean_exit_s"), "openclaw_vs_floor", 3.0),
    ("launcher peak RSS, N=1, openclaw / torchrun", find("n1", "fp_rss_peak_mib"), "openclaw_vs_torchrun", 0.1),
):
    value = row.get(field)
    goals.append(dict(goal=what, value=value, limit=limit, met=value is not None and value <= limit))
topo = {}
for source in ("procfs", "nvml"):
    try:
        with open(os.path.join(out, f"topology-{source}.json")) as f:
            topo[source] = json.load(f)
    except (OSError, ValueError):
        topo[source] = None
same = bool(topo["procfs"] and topo["nvml"]) and [
    {k: g[k] for k in ("index", "uuid", "bus", "name", "numa", "cpus")} for g in topo["procfs"]["gpus"]
] == [{k: g[k] for k in ("index", "uuid", "bus", "name", "numa", "cpus")} for g in topo["nvml"]["gpus"]]
doc = dict(gpu=gpu, rows=rows, goals=goals, topology=topo, procfs_matches_nvml=same)
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(doc, f, indent=1)
print("metric (median)                         run           " + "".join(f"{w:>24}" for w in ("torchrun", "openclaw", "openclaw-telemetry-off", "floor", "oc/floor", "oc/torchrun")))
for r in rows:
    cells = [r.get(w) for w in ("torchrun", "openclaw", "openclaw-telemetry-off", "floor", "openclaw_vs_floor", "openclaw_vs_torchrun")]
    print(f"{r['metric']:<40}{r['run']:<14}" + "".join(f"{'-' if c is None else round(c, 4):>24}" for c in cells))
for g in goals:
    print(f"goal: {g['goal']}: {g['value']} (<= {g['limit']}): {'met' if g['met'] else 'NOT met'}")
for source, t in topo.items():
    print(f"topology via {source}: " + (f"{t['seconds']} s, pynvml imported: {t['pynvml_imported']}, gpus {t['gpus']}, links {t['links']}" if t else "failed"))
print("driver's /proc GPUs == NVML's (index, uuid, bus, name, numa, cpus):", same)
PY

# nothing may be left running
sleep 1
left=$(ps -eo pid,ppid,stat,cmd | grep -E "launchbench|$W|nvidia-cuda-mps" | grep -v grep || true)
echo "leftover processes: ${left:-none}" | tee -a "$OUT/summary.txt"
cat "$OUT"/timeline-*.txt >> "$OUT/summary.txt"
# everything else in one file (the device tool brings back only a few files)
(cd "$OUT" && tar czf "$W/start_path.tgz" --exclude=summary.txt --exclude=summary.json . \
  && find . -maxdepth 1 -type f ! -name summary.txt ! -name summary.json -delete && mv "$W/start_path.tgz" .)
