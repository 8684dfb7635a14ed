#!/usr/bin/env bash
# Straggler verdicts on the lent 2x H200 host, from the repo root through the `device` tool:
#   bash benchmarks/gpu/straggler_gpu.sh            (CASES="balanced input-hooks ..." REPS=4 to choose)
# A GPT-style DDP training (bf16); rank 1 slowed in its input stage (+20 ms DataLoader) or in compute
# (+30 ms of extra GPU matmuls), without and with the telemetry API; then throughput with statistics
# on vs off, interleaved. Reports, console tails and recorded NVML samples land in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
L="python3 -m openclaw_launch"
STEPS=${STEPS:-150}
{
  echo "runtime:"
  echo "  nccl_env: {NCCL_NVLS_ENABLE: \"0\"}"
  echo "  env: {TORCH_SYMM_MEM_DISABLE_MULTICAST: \"1\", NVSHMEM_DISABLE_NVLS: \"1\"}"
} > "$OUT/runtime.yaml"
$L discover --node-name gpuhost --ip 127.0.0.1 > "$OUT/host.yaml" && cat "$OUT/host.yaml" "$OUT/runtime.yaml" > "$OUT/cfg.yaml"
nvidia-smi -L > "$OUT/gpus.txt"

record_nvml() {  # raw NVML samples for the CPU tests' replay (while a job runs)
  python3 - "$1" <<'PY' &
import json, sys, time
from openclaw_launch.stats.gpu import PynvmlSource
import pynvml
pynvml.nvmlInit()
uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
uuids = [u.decode() if isinstance(u, bytes) else u for u in uuids]
src = PynvmlSource(uuids); samples = {u: [] for u in uuids}
time.sleep(8)
for tick in range(12):
    for u in uuids:
        samples[u].append(src.sample(u, with_pcie=tick % 6 == 0))
    time.sleep(0.5)
src.close()
json.dump({"source": "2x H200, during a DDP run with rank 1's GPU doing extra matmuls", "samples": samples}, open(sys.argv[1], "w"), indent=1)
PY
}

case_run() {  # name, then launcher/script args
  local name=$1; shift
  echo "== $name"
  $L --config "$OUT/cfg.yaml" --report "$OUT/$name.json" --stats-interval-s 5 --telemetry "${TELEMETRY:-full}" "$@" > "$OUT/$name.txt" 2>&1
  echo "exit $?"; grep -E "median step|straggler|hint|stats:|synchronisation" "$OUT/$name.txt" | tail -12
  tail -8 "$OUT/$name.txt" | grep -E "^ +[0-9]|^rank" || true
}

T=benchmarks/gpu/straggler_train.py
CASES=${CASES:-balanced input-hooks compute-hooks input-api compute-api}
MODES=${MODES:-off hooks}
REPS=${REPS:-4}
{
  for c in $CASES; do
    case $c in
      balanced) case_run balanced $T --steps "$STEPS" ;;
      input-hooks) case_run input-hooks $T --steps "$STEPS" --slow-rank 1 --slow-phase input --slow-ms 20 ;;
      compute-hooks)
        record_nvml "$OUT/nvml-samples.json"
        case_run compute-hooks $T --steps "$STEPS" --slow-rank 1 --slow-phase compute --slow-ms 30
        wait ;;
      input-api) case_run input-api $T --steps "$STEPS" --slow-rank 1 --slow-phase input --slow-ms 20 --api ;;
      compute-api) case_run compute-api $T --steps "$STEPS" --slow-rank 1 --slow-phase compute --slow-ms 30 --api ;;
    esac
  done
  echo "== overhead: statistics on (hooks) vs off, interleaved"
  for rep in $(seq "$REPS"); do
    for mode in $MODES; do
      $L --config "$OUT/cfg.yaml" --telemetry $mode --console-ranks 0 $T --steps 200 2>&1 | grep "median step" | sed "s/^/$mode rep$rep /"
    done
  done
  echo "== leftovers (expect none)"; ps -eo pid,ppid,stat,cmd | grep -E "straggler_train|defunct" | grep -v grep || echo "(none)"
} 2>&1 | tee "$OUT/straggler-gpu.txt"
# at most 8 files come back from the device: everything else travels in one tarball
tar -C "$OUT" -czf /tmp/straggler-gpu.tgz . && mkdir -p "$OUT/all" && mv /tmp/straggler-gpu.tgz "$OUT/all/"
