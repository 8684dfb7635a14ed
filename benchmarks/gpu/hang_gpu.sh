#!/usr/bin/env bash
# Hang detection on the lent 2x H200 host, from the repo root through the `device` tool:
#   bash benchmarks/gpu/hang_gpu.sh                      (TIMEOUT=10 AT=50 to change)
# Rank 1 stops entering the all-reduce after AT steps; rank 0 blocks in NCCL. Expected: the launcher
# names rank 1 within TIMEOUT + 2 s, every rank's stack is in its log, the job exits 124, and no
# process of the job (and none on the GPUs) is left. At most 8 files land in $OUT.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
WORK=$(mktemp -d)
L="python3 -m openclaw_launch"
TIMEOUT=${TIMEOUT:-10}
AT=${AT:-50}
{
  echo "runtime:"
  echo "  nccl_env: {NCCL_NVLS_ENABLE: \"0\"}"
  echo "  env: {TORCH_SYMM_MEM_DISABLE_MULTICAST: \"1\", NVSHMEM_DISABLE_NVLS: \"1\"}"
} > "$WORK/runtime.yaml"
$L discover --node-name gpuhost --ip 127.0.0.1 > "$WORK/host.yaml" && cat "$WORK/host.yaml" "$WORK/runtime.yaml" > "$WORK/cfg.yaml"
pass=1
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; pass=0; fi; }
{
  nvidia-smi -L
  echo "== a rank stops entering the all-reduce (hang timeout ${TIMEOUT}s)"
  start=$(date +%s.%N)
  $L --config "$WORK/cfg.yaml" --run-id hang --log-dir "$WORK/logs" --report "$OUT/hang-report.json" \
     --hang-timeout-s "$TIMEOUT" --grace-period-s 10 --stats-interval-s 5 \
     benchmarks/gpu/hang_allreduce.py --rank 1 --at "$AT" > "$WORK/console.txt" 2>&1
  code=$?
  end=$(date +%s.%N)
  cat "$WORK/console.txt"
  echo "== exit $code after $(python3 -c "print(round($end - $start, 1))") s"
  # the console has no timestamps: the report's no_step_s says how long after the last step the verdict came
  check "exit code 124" "[ $code -eq 124 ]"
  check "rank 1 named as stuck" "grep -qE '^  rank 1 .* in other' '$WORK/console.txt'"
  check "report: rank 1 stuck, verdict within timeout+2 s" "python3 - '$OUT/hang-report.json' $TIMEOUT <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))['hang']
stuck = [r for r in h['ranks'] if r['stuck']]
print(json.dumps(h['ranks'], indent=1)[:3000])
assert [r['rank'] for r in stuck] == [1], stuck
assert stuck[0]['no_step_s'] <= float(sys.argv[2]) + 2, stuck
PY"
  for r in 0 1; do
    check "rank $r stack in its log" "grep -q 'hang_allreduce.py\", line' '$WORK/logs/hang/attempt-0/rank-$r/stderr.log'"
  done
  check "rank 1's stack shows the sleep loop" "grep -q 'BLOCKS-HERE' benchmarks/gpu/hang_allreduce.py && grep -A30 'stacks of rank 1' '$WORK/logs/hang/attempt-0/rank-1/stderr.log' | grep -q 'in main'"
  sleep 2
  echo "== leftovers (expect none)"
  ps -eo pid,ppid,stat,cmd | grep -E "hang_allreduce|defunct" | grep -v grep || echo "(none)"
  check "no process of the job left" "! pgrep -f hang_allreduce.py >/dev/null"
  apps=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader)
  echo "GPU compute apps: ${apps:-(none)}"
  check "no GPU process left" "[ -z \"$apps\" ]"
  [ "$pass" = 1 ] && echo "PASS" || echo "FAILED"
} 2>&1 | tee "$OUT/hang-gpu.txt"
tar -C "$WORK" -czf "$OUT/hang-logs.tgz" logs console.txt cfg.yaml
rm -rf "$WORK"
