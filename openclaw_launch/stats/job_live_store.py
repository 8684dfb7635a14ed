"""The statistics helper's one connection to the agents' store, for the job's live verdict
(stats/job_live.py): opened once, as the helper starts, and held for the job's life.

Why one, held: torch's TCPStore server (the agents' store on the first node; its libuv backend in
torch 2.13) looks up the name of every new client's address (``getnameinfo``, reverse DNS) on its
one event-loop thread while it accepts the connection, and serves nobody else meanwhile. Where the
resolver drops a query now and then (this box's answers about 50 in a row, then drops one: a 5 s
timeout), each new connection may stall the whole store for that timeout. A helper that opened a
new connection after every failed interval, with a timeout shorter than the stall, fed the stall:
at 128 nodes with a 1 s interval the store stopped serving (docs/multinode.md, "Store connections").

So each node's helper opens one connection; after an error, one reconnect at the next interval
(said on the node's console); at most ``MAX_CONNECTIONS`` in the job's life; a reconnect that fails
ends this node's part in the live verdict (said once; the job goes on, and node 0's line says each
interval that no verdict came). Every call may wait ``STORE_TIMEOUT_S``, longer than such a stall.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

MAX_CONNECTIONS = 3  # the first and two reconnects: the most a node's statistics helper opens in a job
# connect and every call: longer than a store stalled by a resolver (glibc's default, 5 s a try, 2 tries,
# for each of up to 3 name servers): a slow answer is waited for, not given up and asked again
STORE_TIMEOUT_S = 30.0


class StoreClient(Protocol):
    """The calls made on the agents' store (agents/tcpstore_client.py's TCPStoreClient has them)."""

    def set(self, key: str, value: bytes) -> None: ...
    def check(self, keys: Sequence[str]) -> bool: ...
    def multi_get(self, keys: Sequence[str]) -> list[bytes]: ...
    def close(self) -> None: ...


Connect = Callable[[str, int, float], StoreClient]  # (host, port, timeout_s): a connected client


class GivenUp(Exception):
    """This node no longer connects to the store (a reconnect failed, or ``MAX_CONNECTIONS`` were used)."""


class HeldConnection:
    """The connection of one helper's thread (used by that thread only). ``note`` gets each change
    (lost, connecting again, given up) for the node's console."""

    def __init__(self, connect: Connect, host: str, port: int, note: Callable[[str], None]) -> None:
        self._connect, self._note = connect, note
        self.where = f"{host}:{port}"
        self._host, self._port = host, port
        self._client: StoreClient | None = None
        self.opened = 0  # connections opened (tried) so far in the job
        self._given_up: str | None = None  # why, once given up

    def open(self) -> None:
        """The first connection, as the helper starts (before the first interval: the first node's
        store takes each node's connection once, while the job starts). A failure is said, and the
        first interval tries once more."""
        try:
            self._client = self._open()
        except Exception as exc:
            self._note(f"could not connect to the agents' store at {self.where} ({_why(exc)}); trying once more")

    def client(self) -> StoreClient:
        """The held connection; after a failure, one reconnect. Raises ``GivenUp`` once this node no
        longer connects (said once, here), or the reconnect's own error."""
        if self._given_up is not None:
            raise GivenUp(self._given_up)
        if self._client is None:
            try:
                self._client = self._open()
            except Exception as exc:
                self._give_up(f"connection {self.opened} of at most {MAX_CONNECTIONS} failed: {_why(exc)}")
                raise GivenUp(self._given_up) from None
        return self._client

    def lost(self, exc: Exception) -> None:
        """A call failed: the connection is closed; the next ``client`` reconnects once (if any are left)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._given_up is not None:
            return
        if self.opened >= MAX_CONNECTIONS:
            self._give_up(f"{self.opened} connection(s) used, the last lost: {_why(exc)}")
            return
        self._note(
            f"lost the connection to the agents' store at {self.where} ({_why(exc)}); connecting again once "
            f"at the next interval (connection {self.opened + 1} of at most {MAX_CONNECTIONS} in the job)"
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _open(self) -> StoreClient:
        self.opened += 1
        return self._connect(self._host, self._port, STORE_TIMEOUT_S)

    def _give_up(self, why: str) -> None:
        self._given_up = f"this node gave up on the store: {why}"
        self._note(
            f"gave up on the agents' store at {self.where} ({why}): this node's ranks are left out of the "
            "job's live verdict from now on; the job goes on"
        )


def _why(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
