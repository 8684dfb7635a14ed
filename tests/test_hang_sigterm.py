"""A rank the launcher stops keeps its statistics: SIGTERM flushes the recorder's batch (issue 17),
and the process still ends as SIGTERM ends it, or as the script's own handler says; also when the
signal comes while the main thread is inside the recorder's own flush (its lock held: the rank
outlived SIGTERM until SIGKILL, issue 28) or blocked in a gloo collective. Real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from guards import GUARD_S
from host import free_port, needs_torch

from openclaw_launch.telemetry import wire, wire_check

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
    if mode.endswith("blocked"):  # as a main thread blocked in a C call that retries on EINTR (a collective)
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
    if mode.startswith("in-flush"):  # the signal comes while the main thread is inside the recorder's flush
        rec.flush()  # the steps go out first
        def reader(windows):  # the flush's hook (the flight recorder's reader), called under its lock
            os.write(1, b"ready\\n")
            time.sleep(60)
        rec.gpu_sync_reader = reader
        rec.step("api")
        rec.flush()
    os.write(1, b"ready\\n")  # unbuffered: the signal may come before a print() returned
    time.sleep(60)
    """
).format(steps=STEPS)


@pytest.mark.parametrize(
    ("mode", "ends_by"),
    [
        ("python", -signal.SIGTERM),
        ("blocked", -signal.SIGTERM),
        ("user-handler", 5),
        ("in-flush", -signal.SIGTERM),
        ("in-flush-blocked", -signal.SIGTERM),
    ],
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
                item = wire_check.decode_any(inbox.recv(1 << 16))
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


GLOO_RANK = textwrap.dedent(
    """
    import os, time
    import torch, torch.distributed as dist
    from openclaw_launch.telemetry import recorder
    recorder.get(watch_sigterm=True)  # what the bootstrap does first
    dist.init_process_group("gloo")
    dist.all_reduce(torch.tensor([1.0]))
    if dist.get_rank() == 0:
        os.write(1, b"ready\\n")
        time.sleep(60)  # never joins the next all-reduce
    dist.all_reduce(torch.tensor([1.0]))  # rank 1: waits in gloo's C++ for rank 0
    """
)


@needs_torch
def test_sigterm_ends_a_gloo_rank_blocked_in_a_collective(tmp_path: Path) -> None:
    """Rank 1 waits in an all-reduce rank 0 never joins; SIGTERM ends it as SIGTERM would (the
    progress thread's part: Python's handler cannot run while the main thread is in C++)."""
    path, port = str(tmp_path / "s"), str(free_port())
    inboxes = [socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
    procs = []
    try:
        for rank, inbox in enumerate(inboxes):
            inbox.bind(wire.rank_address(path, rank))
            env = {**os.environ, "PYTHONPATH": ROOT, wire.SOCKET_ENV: path, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            env |= {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            command = [sys.executable, "-c", GLOO_RANK]
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
        assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "ready"
        procs[1].send_signal(signal.SIGTERM)  # blocked in the all-reduce, or about to be: ends either way
        assert procs[1].wait(timeout=GUARD_S) == -signal.SIGTERM
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for inbox in inboxes:
            inbox.close()
