"""A client of torch's TCPStore in the standard library: the agents of the nodes that do not host the
store need not import torch (about 2 s of CPU and 200 MiB per launcher; at 128 nodes on one host,
minutes of CPU before any worker starts, benchmarks/scale.py).

It speaks the wire protocol of torch's own client (torch/csrc/distributed/c10d/TCPStore.cpp, as
torch 2.13 sends it, recorded in tests/test_tcpstore_client.py against the real server): on
connect a VALIDATE with the magic number and a PING whose nonce the server echoes; then one query
per call, a one-byte type followed by its operands, strings and byte strings as a little-endian
uint64 length and the bytes, counts as uint64, numbers as int64. Keys carry torch's ``/`` prefix,
so a torch client and this one see the same keys on one server. ``get`` and ``multi_get`` first
wait for their keys, as torch's do, and a wait that outlasts the timeout is cancelled and raises.

Only the calls the agents make (agents/store.py) are here, with torch's names and semantics, and one of
its own: ``wait_until``, a wait that also ends at its own timeout or when another socket has something
to read (an elastic waiting member's, agents/elastic.py), then cancelled, without raising.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Sequence
from datetime import timedelta

VALIDATION_MAGIC = 0x3C85F7CE
KEY_PREFIX = "/"
# the query types, in torch's order (c10d::detail::QueryType)
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT = 0, 1, 2, 3, 4, 5, 6
MULTI_GET, CANCEL_WAIT, PING = 10, 12, 13
READY = 0  # CheckResponseType
STOP_WAITING, WAIT_CANCELED = 0, 1  # WaitResponseType
CONNECT_RETRY_S = 0.1  # between connection attempts while the server is not yet listening


class StoreClientError(RuntimeError):
    """The store could not be reached, answered out of protocol, or a wait timed out."""


class TCPStoreClient:
    """torch's ``TCPStore(host, port, is_master=False, timeout=...)`` for the calls the agents make.
    One thread at a time, as the agents' store is used."""

    def __init__(self, host: str, port: int, timeout: timedelta) -> None:
        """Connect and validate, as torch's client does: a refused connection, one that closes, or
        an answer that is not the store's is tried again until the timeout (the first node's
        launcher may not listen yet), then one error with the last reason."""
        self._timeout_s = timeout.total_seconds()
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                self._sock = _connect(host, port, deadline)
                self._handshake(host, port, deadline)
                return
            except (StoreClientError, OSError) as e:
                reason = str(e) or type(e).__name__
                if getattr(self, "_sock", None) is not None:
                    self._sock.close()
                if time.monotonic() + CONNECT_RETRY_S >= deadline:
                    raise StoreClientError(
                        f"The client socket has timed out after {self._timeout_s:g}s while trying to connect to "
                        f"({host}, {port}): {reason}"
                    ) from None
                time.sleep(CONNECT_RETRY_S)

    def _handshake(self, host: str, port: int, deadline: float) -> None:
        nonce = os.getpid() & 0xFFFFFFFF
        self._send(struct.pack("<BI", VALIDATE, VALIDATION_MAGIC) + struct.pack("<BI", PING, nonce))
        if self._value("<I", max(deadline - time.monotonic(), 0.001)) != nonce:
            raise StoreClientError(f"{host}:{port} answered the handshake out of protocol: not a TCPStore?")

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def set(self, key: str, value: bytes) -> None:
        self._send(bytes([SET]) + _string(key) + _bytes(value))

    def get(self, key: str) -> bytes:
        self._wait([key])
        self._send(bytes([GET]) + _string(key))
        return self._blob()

    def check(self, keys: Sequence[str]) -> bool:
        self._send(bytes([CHECK]) + _count(keys) + b"".join(_string(k) for k in keys))
        return self._value("<B") == READY

    def compare_set(self, key: str, expected: str | bytes, desired: bytes) -> bytes:
        wanted = expected.encode() if isinstance(expected, str) else expected
        self._send(bytes([COMPARE_SET]) + _string(key) + _bytes(wanted) + _bytes(desired))
        return self._blob()

    def add(self, key: str, amount: int) -> int:
        self._send(bytes([ADD]) + _string(key) + struct.pack("<q", amount))
        return int(self._value("<q"))

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self._wait(keys)
        self._send(bytes([MULTI_GET]) + _count(keys) + b"".join(_string(k) for k in keys))
        return [self._blob() for _ in keys]

    def wait_until(self, keys: Sequence[str], timeout_s: float, wake: socket.socket | None = None) -> bool:
        """True once every key is set (the server answers the moment the last is); False when
        ``timeout_s`` passed or ``wake`` has something to read first (the wait is then cancelled: two
        requests in all, however long it waited)."""
        self._send(bytes([WAIT]) + _count(keys) + b"".join(_string(k) for k in keys))
        watch = select.poll()
        watch.register(self._sock, select.POLLIN)
        if wake is not None:
            watch.register(wake, select.POLLIN)
        ready = {fd for fd, _ in watch.poll(max(timeout_s, 0.0) * 1000)}
        if self._sock.fileno() in ready:
            if self._value("<B") != STOP_WAITING:
                raise StoreClientError("the store answered a wait out of protocol")
            return True
        return self._cancel_wait()

    def close(self) -> None:
        self._sock.close()

    def __del__(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()

    # ---- the wire ---------------------------------------------------------------------------------

    def _wait(self, keys: Sequence[str]) -> None:
        """Block until every key is set; past the timeout cancel the wait and raise, as torch does."""
        self._send(bytes([WAIT]) + _count(keys) + b"".join(_string(k) for k in keys))
        try:
            answer = self._value("<B", self._timeout_s)
        except TimeoutError:
            self._cancel_wait()  # torch's client raises even when the keys came just before the cancel
            shown = ", ".join(KEY_PREFIX + k for k in keys)
            raise StoreClientError(f"wait timeout after {self._timeout_s * 1000:.0f}ms, keys: {shown}") from None
        if answer != STOP_WAITING:
            raise StoreClientError("the store answered a wait out of protocol")

    def _cancel_wait(self) -> bool:
        """Cancel the pending wait; True when its keys came just before the cancel (the server then
        answers the wait, then the cancel)."""
        self._send(bytes([CANCEL_WAIT]))
        answer = self._value("<B")
        came = answer == STOP_WAITING
        if came:
            answer = self._value("<B")
        if answer != WAIT_CANCELED:
            raise StoreClientError("the store answered a cancelled wait out of protocol")
        return came

    def _send(self, data: bytes) -> None:
        try:
            self._sock.settimeout(self._timeout_s or None)
            self._sock.sendall(data)
        except OSError as e:
            raise StoreClientError(f"the store's connection failed: {e}") from None

    def _exactly(self, size: int, timeout_s: float | None = None) -> bytes:
        self._sock.settimeout((timeout_s if timeout_s is not None else self._timeout_s) or None)
        chunks, left = [], size
        while left:
            try:
                chunk = self._sock.recv(left)
            except TimeoutError:
                if left == size:
                    raise
                raise StoreClientError("the store stopped in the middle of an answer") from None
            except OSError as e:
                raise StoreClientError(f"the store's connection failed: {e}") from None
            if not chunk:
                raise StoreClientError("the store closed the connection")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _value(self, fmt: str, timeout_s: float | None = None) -> int:
        return int(struct.unpack(fmt, self._exactly(struct.calcsize(fmt), timeout_s))[0])

    def _blob(self) -> bytes:
        return self._exactly(self._value("<Q"))


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """One connection attempt, within what is left of the caller's time."""
    sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _string(key: str) -> bytes:
    return _bytes((KEY_PREFIX + key).encode())


def _bytes(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


def _count(keys: Sequence[str]) -> bytes:
    return struct.pack("<Q", len(keys))
