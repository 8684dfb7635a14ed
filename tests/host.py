"""What the tests ask of the host, shared: a free port, whether one is listened on, whether torch is there.

A port comes from the kernel (a bind to port 0), never from a fixed number, so that tests running
side by side (pytest-xdist) never pick the same one. Whether torch is installed is asked without
importing it: collecting the suite must not pay torch's import (seconds of CPU per process).
"""

from __future__ import annotations

import importlib.util
import socket

import pytest

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
