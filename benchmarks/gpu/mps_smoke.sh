#!/usr/bin/env bash
# MPS smoke test on a GPU host with the REAL nvidia-cuda-mps-control, through openclaw_launch.run.mps.daemon:
# start a private daemon (as a child subreaper, like the launcher), run CUDA clients through it,
# record what the control program answers (server/client lists, limits), check that a second
# daemon on the same pipe dir is refused, stop, and show that no MPS process or <defunct> is left.
# Never changes compute mode or any GPU setting. Everything goes under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"

{
  echo "== host"; date -u; hostname; nvidia-smi -L; nvidia-cuda-mps-control -v 2>&1 | head -3
  echo "== MPS processes before"; ps -eo pid,ppid,stat,cmd | grep -E 'nvidia-cuda-[m]ps|[d]efunct' || echo "(none)"
} > "$OUT/before.txt" 2>&1
cat "$OUT/before.txt"

PYTHONPATH=. python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/mps_smoke.log"
import ctypes, json, os, shutil, subprocess, sys, time
from pathlib import Path

import psutil

from openclaw_launch.errors import LaunchError
from openclaw_launch.plan.env import mps_client_env
from openclaw_launch.plan.model import MpsPlan
from openclaw_launch.run.mps.control import find_mps_processes
from openclaw_launch.run.mps.daemon import MpsDaemon

out = Path(sys.argv[1])
result: dict[str, object] = {}
# The launcher is a child subreaper: the daemon forked off by -d is re-parented to it and must be reaped.
result["subreaper"] = ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
# Reversed, so that with >1 GPU the daemon's device numbering differs from nvidia-smi's: the per-GPU
# client count must still name the right GPUs (checked against `ps`'s DEVICE column below).
uuids = subprocess.run(
    ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, check=True
).stdout.split()[::-1]
plan = MpsPlan(
    max_clients_per_gpu=None,
    active_thread_percentage=50,
    pinned_device_mem_limit="16G",
    on_start_failure="error",
    gpu_uuids=tuple(uuids),
)
daemon = MpsDaemon(plan)
t0 = time.monotonic()
daemon.start()
worker_env = mps_client_env(daemon.pipe_dir, daemon.log_dir)  # what an MPS plan gives each rank
result["start_s"] = round(time.monotonic() - t0, 3)
result["worker_env"] = worker_env
result["daemon_pid"] = daemon.pid
result["daemon_ppid_is_us"] = daemon.pid is not None and psutil.Process(daemon.pid).ppid() == os.getpid()
result["settings_readback"] = daemon.settings
zombies = lambda: [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
result["zombies_after_start"] = zombies()
result["pipe_dir_listing"] = sorted(p.name for p in daemon.pipe_dir.iterdir())
print("worker_env:", json.dumps(worker_env))
print("daemon pid:", daemon.pid, "settings:", daemon.settings)

try:
    second = MpsDaemon(plan, daemon.run_dir)
    second.start()
    result["second_start"] = "STARTED (wrong)"
    second.stop()
except LaunchError as e:
    result["second_start"] = f"refused: {str(e).splitlines()[0]}"

client_env = {**os.environ, **worker_env}
hold = "import sys, torch; x = torch.ones(1, device='cuda'); print(x.sum().item(), flush=True); sys.stdin.read()"
clients = [
    subprocess.Popen(  # isolated: sees only GPU 0, by UUID
        [sys.executable, "-c", hold], env={**client_env, "CUDA_VISIBLE_DEVICES": uuids[0]},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ),
    subprocess.Popen(  # ordered: sees all planned GPUs, uses the last one
        [sys.executable, "-c", hold.replace("'cuda'", f"'cuda:{len(uuids) - 1}'")],
        env={**client_env, "CUDA_VISIBLE_DEVICES": ",".join(uuids)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ),
]
result["client_outputs"] = [c.stdout.readline().strip() if c.stdout else "" for c in clients]
result["client_pids"] = [c.pid for c in clients]
raw = {}
servers = daemon.query("get_server_list").output
raw["get_server_list"] = servers
for pid in servers.split():
    raw[f"get_client_list {pid}"] = daemon.query(f"get_client_list {pid}").output
for cmd in ("get_device_client_list", "ps", "get_default_active_thread_percentage",
            "get_default_device_pinned_mem_limit 0"):
    r = daemon.query(cmd)
    raw[cmd] = f"rc={r.returncode}\n{r.output}"
result["raw"] = raw
status = daemon.status()
result["status"] = {
    "answering": status.answering, "daemon_pid": status.daemon_pid,
    "servers": [[s.pid, list(s.clients)] for s in status.servers],
    "client_count": status.client_count, "clients_per_gpu": dict(status.clients_per_gpu),
    "error": status.error,
}
expected: dict[str, int] = {}
for used in (uuids[0], uuids[-1]):
    expected[used] = expected.get(used, 0) + 1
result["clients_per_gpu_expected"] = expected
result["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
for c in clients:
    c.communicate("", timeout=60)
result["client_returncodes"] = [c.returncode for c in clients]
one_shot = subprocess.run(
    [sys.executable, "-c", 'import torch; x=torch.ones(1,device="cuda"); print(x.sum().item())'],
    env=client_env, capture_output=True, text=True, timeout=120,
)
result["one_shot_client"] = [one_shot.returncode, one_shot.stdout.strip(), one_shot.stderr[-500:]]
server_pids = [int(p) for p in servers.split() if p.isdigit()]
log = daemon.log_dir / "control.log"
if log.exists():
    shutil.copy(log, out / "control.log")
for extra in ("server.log",):
    if (daemon.log_dir / extra).exists():
        shutil.copy(daemon.log_dir / extra, out / extra)

t0 = time.monotonic()
daemon.stop()
result["stop_s"] = round(time.monotonic() - t0, 3)
daemon.stop()  # idempotent
result["left_mps_processes"] = [p.pid for p in find_mps_processes(daemon.pipe_dir)]
result["server_pids_alive"] = [p for p in server_pids if psutil.pid_exists(p)]
result["daemon_alive"] = daemon.pid is not None and psutil.pid_exists(daemon.pid)
result["our_zombies"] = zombies()
result["run_dir_removed"] = not daemon.run_dir.exists()
print(json.dumps({k: v for k, v in result.items() if k != "nvidia_smi"}, indent=2))
print(result["nvidia_smi"])
(out / "mps_smoke.json").write_text(json.dumps(result, indent=2))
ok = (
    result["second_start"].startswith("refused")
    and result["client_returncodes"] == [0, 0]
    and not result["left_mps_processes"] and not result["daemon_alive"] and not result["our_zombies"]
    and not result["zombies_after_start"] and result["status"]["clients_per_gpu"] == expected
)
print("SMOKE", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
rc=${PIPESTATUS[0]}

{
  echo "== MPS processes after (expect none, no <defunct>)"
  ps -eo pid,ppid,stat,cmd | grep -E 'nvidia-cuda-[m]ps|[d]efunct' || echo "(none)"
} | tee "$OUT/ps_after.txt"
exit "$rc"
