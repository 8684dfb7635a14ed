"""The agents' meeting place: torch.distributed's TCPStore, hosted by the first node's launcher on
its own port (not MASTER_PORT). torch is imported here and only here, and only for a multi-node
job: a one-node launch never pays for it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from openclaw_launch.errors import OpenclawError

PREFIX = "openclaw/"


class AgentError(OpenclawError):
    """The agents could not meet, or do not agree: nothing was started (exit 2)."""


def _import_tcpstore() -> Any:
    """c10d logs every failed connect as a C++ warning with a trace; the launcher says what matters
    itself. The level is read when torch loads; the workers' environment is left as it was."""
    import sys

    quiet = "torch" not in sys.modules and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        from torch.distributed import TCPStore
    finally:
        if quiet:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    return TCPStore


class AgentStore:
    """Keys are namespaced; values are text. Blocking calls: use from one thread at a time."""

    def __init__(self, addr: str, port: int, is_host: bool, timeout_s: float) -> None:
        self.addr, self.port, self.is_host = addr, port, is_host
        tcp_store = _import_tcpstore()
        try:
            self._store: Any = tcp_store(  # the host listens on every interface
                addr,
                port,
                None,
                is_host,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except Exception as e:  # DistNetworkError, RuntimeError: one line, not a C++ trace
            what = f"listen on port {port}" if is_host else f"reach the first node's agent at {addr}:{port}"
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise AgentError(
                f"cannot {what} within {timeout_s:g} s ({first}); check --agent-port and that the first "
                "node's launcher runs"
            ) from None

    def set_timeout(self, seconds: float) -> None:
        self._store.set_timeout(timedelta(seconds=seconds))

    def set(self, key: str, value: str) -> None:
        self._store.set(PREFIX + key, value.encode())

    def get(self, key: str) -> str:
        return bytes(self._store.get(PREFIX + key)).decode()

    def has(self, keys: Sequence[str]) -> bool:
        return bool(self._store.check([PREFIX + k for k in keys]))

    def first(self, key: str, value: str) -> str:
        """Set ``key`` unless it is set; return what it holds now (the first writer wins)."""
        return bytes(self._store.compare_set(PREFIX + key, "", value.encode())).decode()

    def get_many(self, keys: Sequence[str]) -> list[str]:
        return [bytes(v).decode() for v in self._store.multi_get([PREFIX + k for k in keys])]
