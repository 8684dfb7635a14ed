#!/usr/bin/env bash
# Diagnosis at the default level (`--telemetry hooks`), issue 17, on the lent 1-GPU H200 host, from the
# repo root:   bash benchmarks/gpu/diagnosis_default.sh
# Two ranks share the GPU under the launcher's own MPS daemon (procs_per_gpu 2, gloo), or with two GPUs
# or more one rank per GPU with NCCL (the 2-GPU kind; not run yet), running
# benchmarks/gpu/diagnosis_train.py (GPT 4x512, batches sliced in the loop, no openclaw code):
#   slow-gpu    rank 1 does ~SLOW_GPU_MS of extra GPU matmuls per step -> rank 1, compute, section gpu
#   slow-input  rank 1 sleeps SLOW_INPUT_MS in its in-loop get_batch     -> rank 1, input (host)
#   slow-loader rank 1's DataLoader sleeps SLOW_INPUT_MS per batch        -> rank 1, input (DataLoader)
#   hang        rank 1 sleeps an hour in Python at step 20               -> exit 124, cause: rank 1
#   hang-kernel rank 1's forward launches a kernel that spins 60 s at step 20 -> exit 124, cause: rank 1
#               (gpu-behind: every host waits, rank 1's GPU never passes the backward mark; GPU only)
# Beyond DDP (issue 27), with CASES naming them (the cases above are the default set):
#   accum-balanced  4 micro-batches per optimizer step (DDP no_sync), nobody slow -> no straggler
#   accum-slow      the same, rank 1 with ACCUM_SLOW_PCT (5) % more GPU work per step, spread over its
#                   micro-batches' forwards (sized from accum-balanced's step) -> rank 1, compute, gpu;
#                   ACCUM_REPS (3) runs; accum-balanced ACCUM_BALANCED_REPS (1) runs
#   fsdp2-balanced  fully_shard per block and root (gloo under MPS: two ranks on the one GPU) -> none
#   fsdp2-slow      the same, rank 1 with ~SLOW_GPU_MS of extra GPU matmuls per forward -> rank 1, compute;
#                   with FSDP2_SLOW_PCT=P instead P % of fsdp2-balanced's step; FSDP2_REPS (1) runs,
#                   fsdp2-balanced FSDP2_BALANCED_REPS (1) runs
# MPS_THREAD_PCT=P (one GPU only): each rank's MPS client may use P % of the GPU's SMs
# (runtime.mps_active_thread_percentage; 50: half each), so that a rank's extra kernels take its own
# time and cannot run on SMs the other rank leaves idle while it waits (as with a GPU per rank).
# The default level's cost is measured by overhead_default.sh. $OUT/summary.txt: one line per case,
# PASS/FAIL, the verdict line and the numbers; $OUT/runs.tgz: every report and console. A run starts
# only while one as long as the previous still fits in BUDGET_S (145 s) and is killed when the budget
# is spent (then SKIP/FAIL lines), each run within RUN_LIMIT_S (60 s). NVLink multicast stays off; no
# GPU setting is changed; MPS daemons the runs leave behind (a launcher killed by its timeout) are
# ended by pid at the end.
# CPU=1 (or no GPU): the same cases with CPU workers and no MPS, the script's own check on a CPU box
# (the slow-gpu case then does CPU matmuls in the forward: expected section forward, not gpu).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/openclaw-out}; mkdir -p "$OUT"
STEPS=${STEPS:-150}; BUDGET_S=${BUDGET_S:-145}; RUN_LIMIT_S=${RUN_LIMIT_S:-60}
CASES=${CASES:-slow-gpu slow-input slow-loader hang hang-kernel}
ACCUM_SLOW_PCT=${ACCUM_SLOW_PCT:-5}; ACCUM_REPS=${ACCUM_REPS:-3}; ACCUM_BALANCED_REPS=${ACCUM_BALANCED_REPS:-1}
FSDP2_SLOW_PCT=${FSDP2_SLOW_PCT:-}; FSDP2_REPS=${FSDP2_REPS:-1}; FSDP2_BALANCED_REPS=${FSDP2_BALANCED_REPS:-1}
MPS_THREAD_PCT=${MPS_THREAD_PCT:-}
TRAIN_ARGS=${TRAIN_ARGS:-}  # more diagnosis_train.py options for every run (e.g. --batch 128: GPU-bound steps)
SLOW_GPU_MS=${SLOW_GPU_MS:-20}; SLOW_INPUT_MS=${SLOW_INPUT_MS:-20}
PY=${PYTHON:-python3}
L="$PY -m openclaw_launch"
T=benchmarks/gpu/diagnosis_train.py
W=$(mktemp -d /tmp/diagnosis.XXXXXX)
START=$SECONDS
mps_pids() { pgrep -f 'nvidia-cuda-mps' 2> /dev/null | sort || true; }
MPS_BEFORE=$(mps_pids)
cleanup() {
  for pid in $(comm -13 <(echo "$MPS_BEFORE") <(mps_pids)); do kill "$pid" 2> /dev/null; done
  rm -rf "$W"
  tar -C "$OUT" -czf "$OUT/runs.tgz" --exclude runs.tgz --exclude summary.txt . 2> /dev/null
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name runs.tgz ! -name summary.txt -exec rm -rf {} +
}
trap cleanup EXIT
GPU=0
if [ "${CPU:-0}" != 1 ] && ls /proc/driver/nvidia/gpus/*/information > /dev/null 2>&1 && command -v nvidia-smi > /dev/null; then
  GPU=1
fi
BACKEND=gloo
if [ "$GPU" = 1 ]; then
  timeout 20 $L discover --node-name gpuhost --ip 127.0.0.1 > "$W/host.yaml" 2> "$OUT/discover.err"
  GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
  { cat "$W/host.yaml"
    echo "runtime:"
    if [ "$GPUS" -ge 2 ]; then  # two GPUs: one rank on each, NCCL (the discovered config lists every GPU)
      BACKEND=nccl
    else  # one GPU: two ranks share it under the launcher's own MPS daemon, gloo (NCCL refuses two ranks on one GPU)
      echo "  procs_per_gpu: 2"
      echo "  enable_mps: true"
      echo "  mps_max_clients_per_gpu: 2"
      [ -z "$MPS_THREAD_PCT" ] || echo "  mps_active_thread_percentage: $MPS_THREAD_PCT"
    fi
    echo "  nccl_env: {NCCL_NVLS_ENABLE: \"0\"}"
    echo "  env: {TORCH_SYMM_MEM_DISABLE_MULTICAST: \"1\", NVSHMEM_DISABLE_NVLS: \"1\"}"
  } > "$OUT/job.yaml"
  JOB=(--config "$OUT/job.yaml"); DEVICE=cuda; GPU_SECTION=gpu
else
  JOB=(--nproc-per-node 2); DEVICE=cpu; GPU_SECTION=forward
fi
: > "$OUT/summary.txt"
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
LAST_RUN_S=15  # a run's expected length: the previous run's
left_s() { echo $((BUDGET_S - (SECONDS - START))); }
in_budget() {  # a run starts only when one as long as the last fits in what is left
  [ "$(left_s)" -ge "$LAST_RUN_S" ] || { say "SKIP $1: $(left_s) s of the ${BUDGET_S} s budget left"; return 1; }
}
bounded() {  # every run ends within the budget, whatever it does
  local limit; limit=$(left_s); [ "$limit" -gt "$RUN_LIMIT_S" ] && limit=$RUN_LIMIT_S; [ "$limit" -lt 1 ] && limit=1
  local began=$SECONDS; timeout -k 3 "$limit" "$@"; local rc=$?; LAST_RUN_S=$((SECONDS - began + 1)); return $rc
}
run_case() {  # name, launcher options ... -- script options ...
  local name=$1; shift
  local opts=() ; while [ "$1" != -- ]; do opts+=("$1"); shift; done; shift
  bounded $L "${JOBS[@]}" "${opts[@]}" --report "$OUT/$name.json" --console-ranks 0 \
    "$T" --device "$DEVICE" --backend "$BACKEND" --steps "$STEPS" $TRAIN_ARGS "$@" > "$OUT/$name.txt" 2>&1
  echo $? > "$W/$name.rc"
}
JOBS=("${JOB[@]}")
wanted() { [[ " $CASES " == *" $1 "* ]]; }
judge() {  # name, expected exit code, expected rank (-1: none), phase (or the hang cause's kind), section (or "hang")
  "$PY" - "$OUT/$1.json" "$OUT/$1.txt" "$(cat "$W/$1.rc" 2> /dev/null || echo none)" "$@" <<'PY'
import json, re, sys
report_path, console_path, rc, name, want_rc, want_rank, want_phase, want_section = sys.argv[1:]
console = open(console_path, errors="replace").read()
step = re.findall(r"rank 0: median step ([0-9.]+) ms", console)
numbers = f"exit {rc}, rank 0 median step {step[-1] if step else '?'} ms"
try:
    report = json.load(open(report_path))
except (OSError, ValueError) as exc:
    print(f"FAIL {name}: no report ({exc.__class__.__name__}); {numbers}")
    sys.exit(0)
if want_section == "hang":
    cause = (report.get("hang") or {}).get("cause") or {}
    line = next((l for l in console.splitlines() if "hang: cause:" in l), "(no cause line)")
    ok = rc == want_rc and cause.get("ranks") == [int(want_rank)] and want_phase in ("-", cause.get("kind"))
    print(f"{'PASS' if ok else 'FAIL'} {name}: {line.strip()}; kind {cause.get('kind')}; {numbers}")
    sys.exit(0)
found = report.get("stragglers") or []
lines = console.splitlines()  # the exit summary's verdict, else the last live line's
line = next((l for l in lines if l.startswith("straggler:")), None) or next((l for l in reversed(lines) if "straggler:" in l), "(no verdict)")
top = found[0] if found else {}
if want_rank == "-1":
    ok = rc == want_rc and not found
    print(f"{'PASS' if ok else 'FAIL'} {name}: {line.strip()}; {numbers}")
    sys.exit(0)
ok = rc == want_rc and (top.get("rank"), top.get("phase"), top.get("section")) == (int(want_rank), want_phase, want_section)
if want_section == "host" and top.get("section") == "input":
    ok = ok or (rc == want_rc and top.get("rank") == int(want_rank) and top.get("phase") == "input")
print(f"{'PASS' if ok else 'FAIL'} {name}: {line.strip()}; excess {top.get('excess_pct')} %; {numbers}")
PY
}
say "== $(date -u +%FT%TZ) $(hostname), gpu=$GPU, backend=$BACKEND, steps=$STEPS, mps_active_thread_percentage=${MPS_THREAD_PCT:-unset}, train args: ${TRAIN_ARGS:-none}"
if wanted slow-gpu && in_budget slow-gpu; then
  run_case slow-gpu -- --slow-gpu-ms "$SLOW_GPU_MS"
  judge slow-gpu 0 1 compute "$GPU_SECTION" | tee -a "$OUT/summary.txt"
fi
if wanted slow-input && in_budget slow-input; then
  run_case slow-input -- --slow-input-ms "$SLOW_INPUT_MS"
  judge slow-input 0 1 input host | tee -a "$OUT/summary.txt"
fi
if wanted slow-loader && in_budget slow-loader; then
  run_case slow-loader -- --loader --slow-input-ms "$SLOW_INPUT_MS"
  judge slow-loader 0 1 input input | tee -a "$OUT/summary.txt"
fi
if wanted hang && in_budget hang; then
  run_case hang --hang-timeout-s 3 -- --hang-at-step 20
  judge hang 124 1 outside hang | tee -a "$OUT/summary.txt"
fi
if wanted hang-kernel && [ "$GPU" = 1 ] && in_budget hang-kernel; then
  run_case hang-kernel --hang-timeout-s 3 -- --hang-kernel-at-step 20 --hang-kernel-s 60
  judge hang-kernel 124 1 gpu-behind hang | tee -a "$OUT/summary.txt"
fi
if wanted accum-balanced; then
  for rep in $(seq "$ACCUM_BALANCED_REPS"); do
    in_budget "accum-balanced-$rep" || break
    run_case "accum-balanced-$rep" -- --accumulation 4
    judge "accum-balanced-$rep" 0 -1 - - | tee -a "$OUT/summary.txt"
  done
fi
if wanted accum-slow; then
  step_ms=$(grep -oP 'rank 0: mean step \K[0-9.]+' "$OUT/accum-balanced-1.txt" 2> /dev/null | tail -1)
  per_micro_ms=$("$PY" -c "print(${step_ms:-100} * $ACCUM_SLOW_PCT / 100 / 4)")
  say "accum-slow: ${ACCUM_SLOW_PCT} % of the balanced ${step_ms:-?} ms step: ${per_micro_ms} ms of GPU work per micro-batch"
  for rep in $(seq "$ACCUM_REPS"); do
    in_budget "accum-slow-$rep" || break
    run_case "accum-slow-$rep" -- --accumulation 4 --slow-gpu-ms "$per_micro_ms"
    judge "accum-slow-$rep" 0 1 compute "$GPU_SECTION" | tee -a "$OUT/summary.txt"
  done
fi
if wanted fsdp2-balanced; then
  for rep in $(seq "$FSDP2_BALANCED_REPS"); do
    in_budget "fsdp2-balanced-$rep" || break
    run_case "fsdp2-balanced-$rep" -- --fsdp2
    judge "fsdp2-balanced-$rep" 0 -1 - - | tee -a "$OUT/summary.txt"
  done
fi
if wanted fsdp2-slow; then
  fsdp2_ms=$SLOW_GPU_MS
  if [ -n "$FSDP2_SLOW_PCT" ]; then  # one forward per step: P % of the balanced step in it
    step_ms=$(grep -oP 'rank 0: mean step \K[0-9.]+' "$OUT/fsdp2-balanced-1.txt" 2> /dev/null | tail -1)
    fsdp2_ms=$("$PY" -c "print(${step_ms:-100} * $FSDP2_SLOW_PCT / 100)")
    say "fsdp2-slow: ${FSDP2_SLOW_PCT} % of the balanced ${step_ms:-?} ms step: ${fsdp2_ms} ms of GPU work per forward"
  fi
  for rep in $(seq "$FSDP2_REPS"); do
    in_budget "fsdp2-slow-$rep" || break
    run_case "fsdp2-slow-$rep" -- --fsdp2 --slow-gpu-ms "$fsdp2_ms"
    judge "fsdp2-slow-$rep" 0 1 compute "$GPU_SECTION" | tee -a "$OUT/summary.txt"
  done
fi
left=$(comm -13 <(echo "$MPS_BEFORE") <(mps_pids) | tr '\n' ' ')
say "MPS processes left by the runs (ended now): ${left:-none}; wall $((SECONDS - START)) s"
