"""What the tests ask of the host, shared: a free port, whether one is listened on, whether torch is
there, a process's first child and whether it catches a signal (read from /proc).

A port comes from the kernel (a bind to port 0), never from a fixed number, so that tests running
side by side (pytest-xdist) never pick the same one. Whether torch is installed is asked without
importing it: collecting the suite must not pay torch's import (seconds of CPU per process).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def free_port() -> int:
    """A TCP port on loopback that nothing uses now, nor the port after it: a launcher's agents'
    store takes ``master_port + 1`` unless told otherwise, and a node whose store port is taken
    stops while the others wait for it."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as after:
                try:
                    after.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port


def listening(port: int) -> bool:
    """Whether something (a launcher hosting the rendezvous, the agents' store) accepts connections
    on ``port`` of loopback."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def first_child(pid: int) -> int:
    """The first child of ``pid`` (``unshare --fork``'s PID 1, say), waited for."""

    def child() -> int | None:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    return wait_for(child, f"process {pid} started no child", poll_s=0.001)


def catches_signal(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` now (its SigCgt mask); False once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except OSError:
        pass
    return False


def signal_pid1_once_caught(command: list[str], sig: int, delay_s: float = 0.0, **popen: object) -> tuple[int, str]:
    """Run ``command`` as PID 1 of a new PID namespace (``unshare --pid --fork``), send it ``sig``
    ``delay_s`` after it first catches SIGTERM (as PID 1 the kernel drops a signal with the default
    disposition), and return its exit code and output (stdout + stderr)."""
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,  # type: ignore[call-overload]
    )
    try:
        pid1 = first_child(proc.pid)
        wait_for(lambda: catches_signal(pid1, signal.SIGTERM) or proc.poll() is not None, "no handler", poll_s=0.0002)
        time.sleep(delay_s)
        os.kill(pid1, sig)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out + err
