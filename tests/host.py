"""What the tests ask of the host, shared: a free port, whether one is listened on, whether torch is
there, a process's first child and whether it catches a signal (read from /proc).

A port comes from the kernel (a bind to port 0), never from a fixed number, so that tests running
side by side (pytest-xdist) never pick the same one. Whether torch is installed is asked without
importing it: collecting the suite must not pay torch's import (seconds of CPU per process).
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest
from guards import wait_for

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
