#!/usr/bin/env bash
# The preflight GEMM on one GPU (issue 20), from the repo root on the 1-GPU H200 host (the lead's
# `device` tool):  bash benchmarks/gpu/preflight_gemm.sh
#   1. `openclaw-launch preflight --nproc-per-node 1 --json`: this host's one GPU, the bf16 n=8192
#      GEMM of the preflight worker (best of 10 x 10 products), its TFLOPS and the exit code (0)
#   2. the same products timed by plain torch in one process (no launcher), for comparison
# Writes $OUT/summary.txt (a few lines, verdict last); budget: 40 s in all (each step has a timeout).
# NVLink multicast stays off in every worker (the host is shared).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
SUM=$OUT/summary.txt
say() { echo "$*" | tee -a "$SUM"; }
: > "$SUM"
say "== $(date -u) $(nvidia-smi -L 2>/dev/null | head -1)"

start=$(date +%s.%N)
timeout 25 python3 -m openclaw_launch preflight --nproc-per-node 1 --json > "$W/pf.json" 2> "$W/pf.err"
code=$?
wall=$(python3 -c "import time; print(round(time.time() - $start, 1))")
say "preflight --nproc-per-node 1: exit $code (expect 0), ${wall} s"
python3 - "$W/pf.json" <<'PY' | tee -a "$SUM"
import json, sys
try:
    d = json.load(open(sys.argv[1]))["decision"]
    for g in d["gemm"]:
        print(f"  preflight GEMM gpu {g['gpu']} {g['device']}: {g['tflops']:.4g} TFLOPS {g['dtype']} n={g['n']} ({g['status']})")
    print(f"  exclude list: {d['exclude_hostlist']!r}")
except Exception as e:
    print(f"  (no verdict: {e})")
PY
[ "$code" = 0 ] || tail -n 20 "$W/pf.err" | tee -a "$SUM"

timeout 12 python3 - <<'PY' 2>&1 | tail -n 3 | tee -a "$SUM"
import time, torch
n, reps, products = 8192, 10, 10
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
out = torch.empty_like(a)
for _ in range(3):
    torch.mm(a, b, out=out)
torch.cuda.synchronize()
best = float("inf")
for _ in range(reps):
    t = time.perf_counter()
    for _ in range(products):
        torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t)
print(f"  plain torch: {2 * n**3 * products / best / 1e12:.1f} TFLOPS bf16 n={n} ({torch.cuda.get_device_name()})")
PY
say "VERDICT: $([ "$code" = 0 ] && grep -q 'preflight GEMM' "$SUM" && echo OK || echo FAILED)"
