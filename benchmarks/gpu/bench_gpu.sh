#!/usr/bin/env bash
# GPU proofs on the lent H200 host, run through the `device` tool from the repo root:
#   bash benchmarks/gpu/bench_gpu.sh live      # discover / validate / plan / snapshot / NVML record / MPS / a real run
#   bash benchmarks/gpu/bench_gpu.sh compare   # throughput vs torchrun, interleaved (compare.py)
# Everything lands in $OUT. NVLink multicast stays off in every worker (the host is shared).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
L="python3 -m openclaw_launch"
CFG=$OUT/cfg; mkdir -p "$CFG"

make_configs() {  # discover this host, then the run variants beside it
  $L discover --node-name gpuhost --ip 127.0.0.1 > "$CFG/host.yaml"
  for v in ordered isolated; do
    for m in "" -mps; do
      { cat "$CFG/host.yaml"
        echo "runtime:"
        echo "  visible_devices: $v"
        echo "  nccl_env: {NCCL_NVLS_ENABLE: \"0\"}"
        echo "  env: {TORCH_SYMM_MEM_DISABLE_MULTICAST: \"1\", NVSHMEM_DISABLE_NVLS: \"1\"}"
        [ -n "$m" ] && echo "  enable_mps: true" && echo "  mps_max_clients_per_gpu: 2"
      } > "$CFG/$v$m.yaml"
    done
  done
}

case "${1:-live}" in
live)
  {
    date -u; nvidia-smi -L; nvidia-smi topo -m; python3 --version; python3 -c 'import torch; print("torch", torch.__version__)'
    make_configs
    echo "== discover (config)"; cat "$CFG/host.yaml"
    echo "== validate"; $L validate --config "$CFG/ordered.yaml"; echo "exit $?"
    echo "== validate (MPS config, no daemon running)"; $L validate --config "$CFG/ordered-mps.yaml"; echo "exit $?"
    echo "== plan (ordered)"; $L plan --config "$CFG/ordered.yaml" -- examples/train.py
    echo "== plan --json (isolated)"; $L plan --config "$CFG/isolated.yaml" --json -- examples/train.py
    echo "== run examples/train.py, ordered, NCCL"; $L --config "$CFG/ordered.yaml" --report "$OUT/run-report.json" examples/train.py --steps 50; echo "exit $?"
    echo "== run with MPS (ordered-mps)"; $L --config "$CFG/ordered-mps.yaml" examples/train.py --steps 50; echo "exit $?"
    echo "== failure under MPS: rank 1 exits 3"; $L --config "$CFG/isolated-mps.yaml" --no-python -- python3 -c 'import os,sys,time; r=int(os.environ["RANK"]); import torch; torch.ones(1,device="cuda"); time.sleep(0.5 if r else 30); sys.exit(3 if r else 0)'; echo "exit $? (expect 3)"
    echo "== leftovers (expect none)"; ps -eo pid,ppid,stat,cmd | grep -E "mps|train.py|python3 -c" | grep -v grep
  } > "$OUT/live.txt" 2>&1
  $L discover --snapshot > "$OUT/snapshot.json" 2>>"$OUT/live.txt"
  python3 -c 'import json; from openclaw_launch.topology.nvml import PynvmlProvider, record_nvml; print(json.dumps(record_nvml(PynvmlProvider()), indent=2))' > "$OUT/nvml.json" 2>>"$OUT/live.txt"
  [ -f benchmarks/gpu/mps_smoke.sh ] && bash benchmarks/gpu/mps_smoke.sh > "$OUT/mps_smoke.txt" 2>&1
  tail -c 6000 "$OUT/live.txt"
  ;;
compare)
  make_configs
  python3 benchmarks/gpu/compare.py --config-dir "$CFG" --reps "${REPS:-2}" --scripts "${SCRIPTS:-allreduce,ddp}" \
    --json "$OUT/compare.json" 2>&1 | tee "$OUT/compare.txt"
  ;;
cleanup)  # an MPS job ended four ways; after each, no MPS process and no <defunct> may be left
  make_configs
  W='import os,sys,time,torch; torch.ones(1,device="cuda"); r=int(os.environ["RANK"]); time.sleep(0.5 if r else 60); sys.exit(3 if r else 0)'
  leftovers() { echo "-- leftovers after $1:"; ps -eo pid,ppid,stat,cmd | grep -E "nvidia-cuda-mps|defunct|python3 -c" | grep -v grep || echo "(none)"; }
  {
    $L --config "$CFG/ordered-mps.yaml" --no-python -- python3 -c 'import torch; torch.ones(1,device="cuda")'; echo "success: exit $?"; leftovers success
    $L --config "$CFG/isolated-mps.yaml" --grace-period-s 2 --no-python -- python3 -c "$W"; echo "failure: exit $? (expect 3)"; leftovers failure
    $L --config "$CFG/ordered-mps.yaml" --no-python -- python3 -c 'import time,torch; torch.ones(1,device="cuda"); time.sleep(60)' & p=$!
    sleep 12; kill -TERM $p; wait $p; echo "sigterm: exit $? (expect 143)"; sleep 1; leftovers sigterm
    $L --config "$CFG/ordered-mps.yaml" --no-python -- python3 -c 'import time,torch; torch.ones(1,device="cuda"); time.sleep(60)' & p=$!
    sleep 12; kill -KILL $p; wait $p; echo "sigkill: exit $? (expect 137)"; sleep 3; leftovers sigkill
  } > "$OUT/cleanup.txt" 2>&1
  cat "$OUT/cleanup.txt"
  ;;
esac
