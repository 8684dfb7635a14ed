#!/bin/bash
# Failure classes on a GPU host (docs/failures.md), about 20 s on one GPU:
#  1. a real CUDA out-of-memory before the first step, under --max-restarts 3: both attempts are
#     classified cuda-oom and the restart storm stops the job after 2 attempts (--exit-code-classes: 70);
#  2. NVML's XID / double-bit ECC event set registers on every GPU as the statistics helper does
#     (stats/gpu.py PynvmlSource), and a poll returns at once (no XID is expected on a healthy host).
# Writes $OUT/summary.json (and the job's report and console log); prints the summary.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the device host runs the carried tree, not an install
OUT=${OUT:-/tmp/failure-classes-gpu}
mkdir -p "$OUT"
cat >"$OUT/oom.py" <<'EOF'
import torch

torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: CUDA out of memory
EOF
python3 -m openclaw_launch --nproc-per-node 1 --max-restarts 3 --restart-backoff-s 0.1 --exit-code-classes \
  --report "$OUT/oom.json" "$OUT/oom.py" >"$OUT/oom.log" 2>&1
code=$?
python3 - "$OUT" "$code" <<'EOF'
import json
import sys
import time

import pynvml

from openclaw_launch.stats.gpu import PynvmlSource

out, code = sys.argv[1], int(sys.argv[2])
report = json.load(open(f"{out}/oom.json"))
pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
supported = {}
for uuid, handle in zip(uuids, handles):
    try:
        supported[uuid] = bool(pynvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted == wanted)
    except pynvml.NVMLError as e:
        supported[uuid] = str(e)
source = PynvmlSource(uuids)
start = time.perf_counter()
events = source.events()
poll_ms = (time.perf_counter() - start) * 1000
source.close()
summary = {
    "oom_exit_code": code,
    "oom_attempts": report["attempts"],
    "oom_failures": [a["failure"] for a in report["attempt_history"]],
    "xid_ecc_events_supported": supported,
    "events_now": events,
    "event_poll_ms": round(poll_ms, 3),
}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1))
EOF
