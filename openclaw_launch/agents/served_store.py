"""torch's TCPStore held by another process, so that the agents' helper need not import torch.

With ``OPENCLAW_AGENT_STORE_SERVER`` set to a unix socket's path, the agents' store (agents/store.py)
is a ``ServedTCPStore``: its construction and every call are made by the process listening there
(``python -m openclaw_launch.agents.served_store PATH``) on a real TCPStore, in a child forked for
this one store. Each store is then a process of its own, as in the helper: a host listens on its
port (a second one there fails as it would), and the store ends with the helper: when the helper's
connection closes, its child exits at once, even inside a call. The serving process imports torch
once and its children share it; the helpers never import it.

The test suite serves this way the stores of the multi-node launchers whose subject is not the store
itself (tests/conftest.py, ``served_agent_stores``): one torch import for the session instead of one
per launcher, about 2 s of CPU each. The calls, their blocking and their errors' text are TCPStore's.

One JSON line per request (``[call, args...]``) and per answer (``{"value": ...}`` or
``{"error": text}``); bytes travel as latin-1 text, one character per byte.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, BinaryIO, NoReturn

SERVER_ENV = "OPENCLAW_AGENT_STORE_SERVER"


class ServedTCPStore:
    """TCPStore's constructor and the calls ``AgentStore`` makes, each made by the serving process."""

    def __init__(
        self,
        server: str,
        host_name: str,
        port: int,
        world_size: int | None,
        is_master: bool,
        timeout: timedelta,
        wait_for_workers: bool,
    ) -> None:
        self._socket = socket.socket(socket.AF_UNIX)
        self._socket.connect(server)
        self._file = self._socket.makefile("rwb")
        self._call("open", host_name, port, world_size, is_master, timeout.total_seconds(), wait_for_workers)

    def _call(self, name: str, *args: Any) -> Any:
        self._file.write(json.dumps([name, *args]).encode() + b"\n")
        self._file.flush()
        line = self._file.readline()
        if not line:
            raise RuntimeError(f"the process serving the agents' store ({SERVER_ENV}) is gone")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["value"]

    def set_timeout(self, timeout: timedelta) -> None:
        self._call("set_timeout", timeout.total_seconds())

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, value.decode("latin-1"))

    def get(self, key: str) -> bytes:
        return str(self._call("get", key)).encode("latin-1")

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self._call("check", list(keys)))

    def compare_set(self, key: str, expected: str, desired: bytes) -> bytes:
        return str(self._call("compare_set", key, expected, desired.decode("latin-1"))).encode("latin-1")

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, amount))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [str(value).encode("latin-1") for value in self._call("multi_get", list(keys))]


def served_tcpstore(server: str) -> Callable[..., ServedTCPStore]:
    """TCPStore's stand-in whose stores the process listening at the unix socket ``server`` holds."""
    return functools.partial(ServedTCPStore, server)


def _opened(tcp_store: Any, args: list[Any]) -> Any:
    host_name, port, world_size, is_master, timeout_s, wait_for_workers = args
    timeout = timedelta(seconds=timeout_s)
    return tcp_store(host_name, port, world_size, is_master, timeout=timeout, wait_for_workers=wait_for_workers)


def _called(store: Any, name: str, args: list[Any]) -> Any:
    """One call on the TCPStore ``store``, its value as JSON."""
    if name == "set_timeout":
        return store.set_timeout(timedelta(seconds=args[0]))
    if name == "set":
        return store.set(args[0], args[1].encode("latin-1"))
    if name == "get":
        return bytes(store.get(args[0])).decode("latin-1")
    if name == "check":
        return bool(store.check(args[0]))
    if name == "compare_set":
        return bytes(store.compare_set(args[0], args[1], args[2].encode("latin-1"))).decode("latin-1")
    if name == "add":
        return int(store.add(args[0], args[1]))
    if name == "multi_get":
        return [bytes(value).decode("latin-1") for value in store.multi_get(args[0])]
    raise ValueError(f"the agents' store has no call {name!r}")


def _answer(requests: queue.Queue[bytes], out: BinaryIO, tcp_store: Any) -> None:
    """Make the store and its calls, in order, answering each (a thread of the store's child)."""
    store: Any = None
    while True:
        name, *args = json.loads(requests.get())
        answer: dict[str, Any] = {}
        try:
            if name == "open":
                store, answer["value"] = _opened(tcp_store, args), None
            else:
                answer["value"] = _called(store, name, args)
        except Exception as e:  # TCPStore's own error, its text as the helper would have it
            answer["error"] = str(e).strip() or type(e).__name__
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


def _serve_one(connection: socket.socket, tcp_store: Any) -> NoReturn:
    """One helper's store, in its child: the calls in a thread, while this one reads the requests
    (the helper sends none during a call), so that the connection's end ends the store at once."""
    requests: queue.Queue[bytes] = queue.Queue()
    answering = threading.Thread(target=_answer, args=(requests, connection.makefile("wb"), tcp_store), daemon=True)
    answering.start()
    for line in connection.makefile("rb"):
        requests.put(line)
    os._exit(0)  # the helper is gone: its store goes with it, as in the helper


def serve(path: str) -> None:
    """Listen at the unix socket ``path``; each connection's store in a child forked for it. Ends
    when the process that started it does (a test session killed before it could stop this one)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # agents/store.py's import_tcpstore: quiet c10d
    from torch.distributed import TCPStore

    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(1.0)  # to look at the parent now and then; the accepted sockets block
    while os.getppid() == parent:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            listener.close()
            _serve_one(connection, TCPStore)
        connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
