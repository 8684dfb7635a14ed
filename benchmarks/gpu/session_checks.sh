#!/usr/bin/env bash
# One lease, every GPU check of the 2026-12-02 issues (17, 18, 20), from the repo root on the 1-GPU
# H200 host:  TOTAL_S=235 bash benchmarks/gpu/session_checks.sh
# Runs, each under its own limit and into its own folder of $OUT: the preflight GEMM (issue 20),
# the fingerprint's versions against torch's and NVML's (issue 20), failure classes with a real CUDA
# out-of-memory (issue 18), then the default-level diagnosis cases with what is left of TOTAL_S
# (issue 17). $OUT/session.txt: each part's exit code and wall time, then each part's summary.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/openclaw-out}; TOTAL_S=${TOTAL_S:-235}; START=$SECONDS
mkdir -p "$OUT"
part() {  # name, limit_s, command ...
  local name=$1 limit=$2; shift 2
  mkdir -p "$OUT/$name"
  local began=$SECONDS
  OUT="$OUT/$name" timeout -k 3 "$limit" "$@" > "$OUT/$name/console.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - began)) s" | tee -a "$OUT/session.txt"
}
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
part gemm 40 bash benchmarks/gpu/preflight_gemm.sh
part fingerprint 25 python3 benchmarks/gpu/fingerprint_gpu.py
part failures 25 bash benchmarks/gpu/failure_classes_gpu.sh
left=$((TOTAL_S - (SECONDS - START) - 8))
export BUDGET_S=$((left - 5))
part diagnosis "$left" bash benchmarks/gpu/diagnosis_default.sh
for name in gemm fingerprint failures diagnosis; do
  echo "== $name" >> "$OUT/session.txt"
  cat "$OUT/$name/summary.txt" "$OUT/$name/fingerprint_gpu.txt" "$OUT/$name/summary.json" 2> /dev/null >> "$OUT/session.txt"
done
cat "$OUT/session.txt"
