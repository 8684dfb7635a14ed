#!/usr/bin/env bash
# The cost of the statistics on a GPU (issue 17: the default level at most 0.5 %), from the repo root
# on the lent H200 host:   bash benchmarks/gpu/overhead_default.sh
# One rank on one GPU (NCCL), benchmarks/gpu/diagnosis_train.py as a GPT of LAYERS x WIDTH (12 x 1024),
# batches sliced in the loop, `.item()` every step (the host waits for the GPU each step, so any host
# cost of the hooks shows in the step), STEPS steps of which the last STEPS - WARMUP are timed (the GPU
# synchronized at both ends). MODES (all by default), interleaved REPS times (the order rotates each rep):
#   off        openclaw-launch --telemetry off
#   hooks      openclaw-launch (the default level: zero-code hooks, CUDA events on every 5th step)
#   hooks-hang openclaw-launch --hang-timeout-s 120 (adds the progress thread and a GPU mark per phase)
#   full       openclaw-launch --telemetry full (adds NCCL's flight recorder with timing)
#   torchrun   torchrun --standalone
# $OUT/summary.txt: per mode the median over reps of the mean step, and its throughput against `off`
# (off_ms / mode_ms); $OUT/runs.tgz: every console. The tree is copied and compiled first (the carried
# tree has no bytecode). NVLink multicast stays off; no GPU setting is changed.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
SRC=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
STEPS=${STEPS:-300}; WARMUP=${WARMUP:-50}; REPS=${REPS:-5}; LAYERS=${LAYERS:-12}; WIDTH=${WIDTH:-1024}; BATCH=${BATCH:-16}
BUDGET_S=${BUDGET_S:-330}; PY=${PYTHON:-python3}
W=$(mktemp -d /tmp/overhead.XXXXXX)
cp -r "$SRC/openclaw_launch" "$SRC/benchmarks" "$W/" && "$PY" -m compileall -q "$W/openclaw_launch" > /dev/null
cd "$W" || exit 1
export PYTHONPATH=$W${PYTHONPATH:+:$PYTHONPATH}
RUNS="$W/runs"; mkdir -p "$RUNS"
finish() {
  tar -C "$RUNS" -czf "$OUT/runs.tgz" . 2> /dev/null
  rm -rf "$W"
}
trap finish EXIT
# SCRIPT_ARGS: more script options (the script's own check here: SCRIPT_ARGS="--device cpu --backend gloo")
# shellcheck disable=SC2206
T=(benchmarks/gpu/diagnosis_train.py --backend nccl --steps "$STEPS" --warmup "$WARMUP" --layers "$LAYERS" --width "$WIDTH" --batch "$BATCH" ${SCRIPT_ARGS:-})
L=("$PY" -m openclaw_launch --nproc-per-node 1)
command_of() {
  case $1 in
    off) echo "${L[*]} --telemetry off ${T[*]}" ;;
    hooks) echo "${L[*]} ${T[*]}" ;;
    hooks-hang) echo "${L[*]} --hang-timeout-s 120 ${T[*]}" ;;
    full) echo "${L[*]} --telemetry full ${T[*]}" ;;
    torchrun) echo "torchrun --standalone --nproc-per-node 1 ${T[*]}" ;;
  esac
}
read -r -a MODES <<< "${MODES:-off hooks hooks-hang full torchrun}"
START=$SECONDS
echo "== $(date -u +%FT%TZ) $(hostname) $(nvidia-smi -L 2> /dev/null | head -1)" | tee "$OUT/summary.txt"
echo "GPT ${LAYERS}x${WIDTH}, batch $BATCH x 256 tokens, $STEPS steps (last $((STEPS - WARMUP)) timed), reps $REPS" | tee -a "$OUT/summary.txt"
for rep in $(seq "$REPS"); do
  for i in "${!MODES[@]}"; do
    mode=${MODES[$(((i + rep - 1) % ${#MODES[@]}))]}
    left=$((BUDGET_S - (SECONDS - START)))
    [ "$left" -gt 20 ] || { echo "SKIP rep $rep $mode: budget spent" | tee -a "$OUT/summary.txt"; break 2; }
    # shellcheck disable=SC2046
    timeout -k 3 "$left" $(command_of "$mode") > "$RUNS/$mode-$rep.txt" 2>&1
    echo "rep $rep $mode: exit $? $(grep -oP 'rank 0: mean step \K[0-9.]+' "$RUNS/$mode-$rep.txt" | tail -1) ms" | tee -a "$OUT/summary.txt"
  done
done
"$PY" - "$RUNS" "${MODES[@]}" <<'PY' | tee -a "$OUT/summary.txt"
import pathlib, re, statistics, sys
runs, modes = pathlib.Path(sys.argv[1]), sys.argv[2:]
means = {}
for mode in modes:
    values = []
    for path in sorted(runs.glob(f"{mode}-*.txt")):
        if not re.fullmatch(rf"{re.escape(mode)}-[0-9]+\.txt", path.name):
            continue  # hooks-hang-1.txt is not a hooks run
        found = re.findall(r"rank 0: mean step ([0-9.]+) ms", path.read_text(errors="replace"))
        if found:
            values.append(float(found[-1]))
    means[mode] = values
base = statistics.median(means["off"]) if means.get("off") else None
for mode in modes:
    values = means[mode]
    if not values or base is None:
        print(f"{mode:10s} no complete run")
        continue
    median = statistics.median(values)
    print(f"{mode:10s} mean step {median:.3f} ms (reps {', '.join(f'{v:.3f}' for v in values)}); throughput vs off {base / median:.4f}")
if base is not None and means.get("hooks"):
    ratio = base / statistics.median(means["hooks"])
    print(f"{'PASS' if ratio >= 0.995 else 'FAIL'} default level (hooks) costs {100 * (1 - ratio):.2f} % (goal <= 0.5 %)")
PY
