"""The standard-library TCPStore client (openclaw_launch/agents/tcpstore_client.py) against torch's
real TCPStore server: every call the agents make, seen the same way by a torch client on the same
server, a wait that times out, and ports that are no store."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from host import free_port, needs_torch

from openclaw_launch.agents.tcpstore_client import StoreClientError, TCPStoreClient

pytestmark = needs_torch


@pytest.fixture
def server() -> Iterator[tuple[object, int]]:
    """torch's own server, and a torch client on it."""
    from torch.distributed import TCPStore

    host = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    yield host, host.port


def test_every_call_agrees_with_torchs_client_on_one_server(server: tuple[object, int]) -> None:
    torch_store, port = server
    ours = TCPStoreClient("127.0.0.1", port, timedelta(seconds=5))
    ours.set("a", b"1")
    assert bytes(torch_store.get("a")) == b"1"  # type: ignore[attr-defined]
    torch_store.set("b", b"\x00\xff two")  # type: ignore[attr-defined]
    assert ours.get("b") == b"\x00\xff two"
    assert ours.check(["a", "b"]) and not ours.check(["a", "never"])
    assert ours.compare_set("c", "", b"first") == b"first"
    assert ours.compare_set("c", "", b"second") == b"first"  # the first writer wins
    assert bytes(torch_store.compare_set("c", "", b"third")) == b"first"  # type: ignore[attr-defined]
    assert [ours.add("n", 2), int(torch_store.add("n", 3)), ours.add("n", 0)] == [2, 5, 5]  # type: ignore[attr-defined]
    assert ours.multi_get(["a", "b", "c"]) == [b"1", b"\x00\xff two", b"first"]
    ours.set("big", b"x" * 3_000_000)
    assert len(bytes(torch_store.get("big"))) == 3_000_000  # type: ignore[attr-defined]
    ours.close()


def test_a_get_waits_for_its_key_and_a_wait_past_the_timeout_raises_then_the_link_still_works(
    server: tuple[object, int],
) -> None:
    torch_store, port = server
    ours = TCPStoreClient("127.0.0.1", port, timedelta(seconds=5))
    threading.Timer(0.3, lambda: torch_store.set("later", b"now")).start()  # type: ignore[attr-defined]
    assert ours.get("later") == b"now"
    ours.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(StoreClientError, match="wait timeout after 300ms, keys: /never"):
        ours.get("never")
    with pytest.raises(StoreClientError, match="keys: /a, /never"):
        ours.multi_get(["a", "never"])
    ours.set("after", b"ok")  # the cancelled waits left nothing unread on the connection
    assert ours.get("after") == b"ok"


def test_wait_until_ends_when_its_key_is_set_or_at_its_timeout_or_at_a_wake_up_without_raising(
    server: tuple[object, int],
) -> None:
    """An elastic waiting member's one blocking wait (agents/elastic.py): woken by the host's set,
    cancelled at its own timeout or when another socket has data; the connection works after each."""
    torch_store, port = server
    ours = TCPStoreClient("127.0.0.1", port, timedelta(seconds=5))
    threading.Timer(0.2, lambda: torch_store.set("news/1", b"1")).start()  # type: ignore[attr-defined]
    assert ours.wait_until(["news/1"], 5.0)
    assert not ours.wait_until(["news/2"], 0.1)
    here, there = socket.socketpair()
    with here, there:
        there.send(b"?")
        assert not ours.wait_until(["news/2"], 120.0, wake=here)  # at once: the wake socket had data
    torch_store.set("news/2", b"1")  # type: ignore[attr-defined]
    assert ours.wait_until(["news/2"], 0.1)
    ours.set("after", b"ok")
    assert ours.get("after") == b"ok"


def test_nothing_listening_is_an_error_within_the_timeout() -> None:
    with pytest.raises(StoreClientError, match=r"timed out after 0.5s while trying to connect"):
        TCPStoreClient("127.0.0.1", free_port(), timedelta(seconds=0.5))


@pytest.mark.parametrize(
    ("answer", "reason"),
    [(b"", "the store closed the connection"), (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not a TCPStore")],
)
def test_a_port_that_is_no_store_is_tried_until_the_timeout_then_named(answer: bytes, reason: str) -> None:
    """A listener that closes at once, or answers like an HTTP server: tried again and again, as
    torch's client does (the first node may not listen yet), then one error with the reason."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    tries = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            tries.append(conn.recv(64))
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    with pytest.raises(StoreClientError, match=f"timed out after 1s while trying to connect .*{reason}"):
        TCPStoreClient("127.0.0.1", listener.getsockname()[1], timedelta(seconds=1))
    listener.close()
    assert len(tries) > 1
