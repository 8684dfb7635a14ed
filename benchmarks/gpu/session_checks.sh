#!/usr/bin/env bash
# One lease, the GPU checks on the 1-GPU host, from the repo root:
#   TOTAL_S=560 bash benchmarks/gpu/session_checks.sh
# Runs, each under its own limit and into its own folder of $OUT: the default level's cost
# (overhead_default.sh: off / hooks / hooks with hang detection / full / torchrun, interleaved), then
# the default-level diagnosis cases (diagnosis_default.sh) with what is left of TOTAL_S.
# Each part's own settings (the two scripts share names such as STEPS) as VAR=value words:
#   OVERHEAD_SET="MODES='off hooks torchrun' REPS=5"  DIAGNOSIS_SET="CASES='accum-balanced' STEPS=120"
# (issue 27's lease: see benchmarks/RESULTS.md for the command it ran).
# $OUT/session.txt: each part's exit code and wall time, then each part's summary; each part's
# runs.tgz beside it (the lease returns at most 8 files, 2 folders down).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/openclaw-out}; TOTAL_S=${TOTAL_S:-560}; START=$SECONDS
mkdir -p "$OUT"
part() {  # name, limit_s, settings (VAR=value words), command ...
  local name=$1 limit=$2 settings=$3; shift 3
  mkdir -p "$OUT/$name"
  local began=$SECONDS
  # shellcheck disable=SC2086  # the settings are words, each VAR=value (quoted values stay whole via eval)
  eval "OUT=\"\$OUT/\$name\" $settings timeout -k 3 \"\$limit\" \"\$@\"" > "$OUT/$name/console.txt" 2>&1
  echo "$name: exit $? in $((SECONDS - began)) s" | tee -a "$OUT/session.txt"
}
nvidia-smi -L > "$OUT/session.txt" 2>&1
OVERHEAD_S=${OVERHEAD_S:-330}
part overhead "$OVERHEAD_S" "BUDGET_S=$((OVERHEAD_S - 10)) ${OVERHEAD_SET:-}" bash benchmarks/gpu/overhead_default.sh
left=$((TOTAL_S - (SECONDS - START) - 8))
part diagnosis "$left" "BUDGET_S=$((left - 5)) ${DIAGNOSIS_SET:-}" bash benchmarks/gpu/diagnosis_default.sh
for name in overhead diagnosis; do
  echo "== $name" >> "$OUT/session.txt"
  cat "$OUT/$name/summary.txt" >> "$OUT/session.txt" 2> /dev/null
  rm -f "$OUT/$name/console.txt"
done
cat "$OUT/session.txt"
