"""A rank the launcher stops keeps its statistics: SIGTERM flushes the recorder's batch (issue 17),
and the process still ends as SIGTERM ends it, or as the script's own handler says. Real processes."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.telemetry import wire

ROOT = str(Path(__file__).parent.parent)
STEPS = 8  # boundaries: 8 steps, all within one flush interval (none sent before the signal)

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from openclaw_launch.telemetry import recorder
    rec = recorder.get(watch_sigterm=True)  # what the bootstrap does first
    for _ in range({steps}):
        rec.step("api")
    mode = sys.argv[1]
    if mode == "user-handler":
        def mine(signum, frame):
            os.write(1, b"user handler\\n")
            sys.exit(5)
        signal.signal(signal.SIGTERM, mine)
    if mode == "blocked":  # as a main thread blocked in a C call that retries on EINTR (a collective)
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
    os.write(1, b"ready\\n")  # unbuffered: the signal may come before a print() returned
    time.sleep(60)
    """
).format(steps=STEPS)


@pytest.mark.parametrize(
    ("mode", "ends_by"),
    [("python", -signal.SIGTERM), ("blocked", -signal.SIGTERM), ("user-handler", 5)],
)
def test_sigterm_flushes_the_batch_and_ends_as_before(tmp_path: Path, mode: str, ends_by: int) -> None:
    path = str(tmp_path / "s")
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(wire.rank_address(path, 0))
    env = {"PYTHONPATH": ROOT, wire.SOCKET_ENV: path, "RANK": "0", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, mode], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=GUARD_S) == ends_by
        steps = 0
        inbox.settimeout(0.5)
        try:
            while True:
                item = wire.decode_any(inbox.recv(1 << 16))
                if isinstance(item, wire.Batch):
                    steps += len(item.steps)
        except TimeoutError:
            pass
        assert steps == STEPS
        if mode == "user-handler":
            assert proc.stdout.read().strip() == "user handler"
    finally:
        proc.kill()
        proc.wait()
        inbox.close()
