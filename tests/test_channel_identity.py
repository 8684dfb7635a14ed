"""Issue 32 item 9: the statistics channel's identity (stats/inbox.py), with real launchers.

- Any local user can bind an abstract socket name first. The launcher's name holds a nonce drawn at
  start: a squatter that binds every name it can derive (the run id, the launcher's pid, each
  rank's suffix) before the launcher exists does not stop the job.
- A process with CAP_SYS_ADMIN (these tests run as root) can forge ``SCM_CREDENTIALS``: datagrams in
  the rank's name without the run's token are dropped and counted; the same datagrams with the token
  (read from the rank's environment, as root can) are taken: what the token does not defend.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for

from openclaw_launch.telemetry import wire

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = [sys.executable, "-m", "openclaw_launch"]

#: A rank that steps 5 times, says its pid, waits for ``go`` and steps 5 more.
WORKER = """
import os, sys, time
from pathlib import Path
from openclaw_launch import telemetry
out = Path(sys.argv[1])
for _ in range(5):
    telemetry.step()
(out / "pid.tmp").write_text(str(os.getpid()))
os.rename(out / "pid.tmp", out / "pid")
while not (out / "go").exists():
    time.sleep(0.02)
for _ in range(5):
    telemetry.step()
"""

#: Execs the launcher once its pid is known to the test: the squatter binds first.
EXEC_WHEN_TOLD = (
    "import os, sys; print(os.getpid(), flush=True); sys.stdin.readline(); os.execv(sys.argv[1], sys.argv[1:])"
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_a_squatter_on_every_derivable_name_does_not_stop_the_job(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", EXEC_WHEN_TOLD, *LAUNCHER, "--run-id", "squat", "--nproc-per-node", "2",
         "--report", str(tmp_path / "r.json"), "--no-python", "true"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    pid = int(proc.stdout.readline())
    squatters = []
    try:
        for base in (f"openclaw-squat-{pid}", f"openclaw-squat-{pid}-0", "openclaw-squat"):
            for suffix in ("", ".0", ".1"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.bind("\0" + base + suffix)
                squatters.append(s)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        for s in squatters:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err


def _forge(address: str, pid: int, data: bytes) -> None:
    """``data`` to ``address`` with credentials naming ``pid`` (CAP_SYS_ADMIN: the kernel allows it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        creds = struct.pack("3i", pid, os.getuid(), os.getgid())
        s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)], 0, address)


def _rank_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.skipif(os.geteuid() != 0, reason="forging SCM_CREDENTIALS needs CAP_SYS_ADMIN (root)")
@pytest.mark.parametrize("with_token", [False, True], ids=["no-token", "token-read-from-environ"])
def test_forged_credentials_without_the_token_are_dropped(tmp_path: Path, with_token: bool) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    report = tmp_path / "r.json"
    proc = subprocess.Popen(
        [*LAUNCHER, "--nproc-per-node", "1", "--report", str(report), "--stats-interval-s", "0",
         str(tmp_path / "worker.py"), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        rank_pid = int(wait_for(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text(), "no pid"))
        environ = _rank_env(rank_pid)
        address = wire.rank_address(environ[wire.SOCKET_ENV], int(environ[wire.SLOT_ENV]))
        token = environ[wire.TOKEN_ENV].encode() if with_token else b""
        forged = wire.encode(wire.Batch(rank=0, steps=[(0.01, {})] * 100))
        for _ in range(3):
            _forge(address, rank_pid, token + forged)
        (tmp_path / "go").write_text("")
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    rank = json.loads(report.read_text())["ranks"][0]
    dropped = json.loads(report.read_text())["statistics"]["dropped_datagrams"]
    if with_token:  # root that reads the rank's environment is the rank, as far as the channel can tell
        assert rank["statistics"]["steps"] == 10 + 300 and not dropped, (rank, dropped)
    else:
        assert rank["statistics"]["steps"] == 10, rank
        assert dropped["0"]["not_rank_process"] == 3, dropped
        assert f"without the run's token ({wire.TOKEN_ENV}) ignored" in err, err
