"""The first node's liveness port (agents/liveness.py) as a protocol with an identity, on real
sockets: a line that is not the protocol (an HTTP probe, ``N``, ``999``) is dropped and counted,
never trusted and never a traceback; a wrong secret is refused; an authenticated member is
admitted, refused with its reason, or seen gone when its link closes; and the port listens only
on the rendezvous's interface."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from typing import Any

import pytest
from guards import wait_for

from openclaw_launch.agents.admission import refusal
from openclaw_launch.agents.job_secret import JobKey
from openclaw_launch.agents.liveness import HELLO_MAX_BYTES, LivenessServer, connect
from openclaw_launch.agents.store import AgentError

KEY = JobKey.of("s3cret", True)


class Port:
    """A liveness port on 127.0.0.1 whose admissions and departures are recorded."""

    def __init__(self, key: JobKey = KEY, refuse: str | None = None) -> None:
        self.admitted: list[int] = []
        self.gone: list[int] = []
        self.said: list[str] = []
        self._refuse = refuse
        self.server = LivenessServer(key, "job7", self._admit, self.gone.append, self.said.append)
        self.port = self.server.start("127.0.0.1")

    def _admit(self, member_id: int, record: dict[str, Any]) -> str | None:
        if self._refuse is not None:
            return self._refuse
        self.admitted.append(member_id)
        return None

    def raw(self, data: bytes, keep: bool = False) -> socket.socket:
        """A client that reads the challenge, sends ``data`` and (unless ``keep``) closes."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.recv(4096)
        with contextlib.suppress(OSError):  # the port may close it before all is sent
            sock.sendall(data)
        if not keep:
            sock.close()
        return sock


def record(member_id: int = 1) -> dict[str, Any]:
    return {"id": member_id, "token": "host pid 1 #ab", "standby": False, "node": "", "admission": {}}


def test_lines_that_are_not_the_protocol_are_dropped_and_counted_and_the_port_still_serves() -> None:
    port = Port()
    port.raw(b"1\n")  # once expelled member 1
    port.raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # once killed the port's thread
    held = port.raw(b"999\n", keep=True)  # once blocked the rendezvous lock
    port.raw(b"hello 00 " + json.dumps(record()).encode() + b"\n")  # a wrong MAC
    port.raw(b"\xff" * 100 + b"\n")
    wait_for(lambda: sum(port.server.dropped.values()) >= 5, lambda: f"dropped: {port.server.dropped}")
    assert port.admitted == [] and port.gone == []
    link = connect("127.0.0.1", port.port, KEY, "job7", record(1), 5)  # the port still serves
    wait_for(lambda: port.admitted == [1], "member 1 never admitted")
    assert port.server.dropped["not the protocol"] >= 3 and port.server.dropped["wrong job secret"] == 1
    assert "dropped" in port.server.summary() and any("never trusted" in s for s in port.said)
    link.close()
    wait_for(lambda: port.gone == [1], "the member's closed link never seen")
    held.close()


def test_a_wrong_secret_or_another_rendezvous_id_is_refused_with_an_error() -> None:
    port = Port()
    with pytest.raises(AgentError, match="OPENCLAW_JOB_SECRET"):
        connect("127.0.0.1", port.port, JobKey.of("other", True), "job7", record(), 5)
    with pytest.raises(AgentError, match="job secret"):
        connect("127.0.0.1", port.port, KEY, "job8", record(), 5)
    wait_for(lambda: port.server.dropped["wrong job secret"] == 2, lambda: f"dropped: {port.server.dropped}")
    assert port.admitted == []


def test_a_refused_member_is_told_why_and_a_second_link_for_one_member_is_dropped() -> None:
    refused = Port(refuse="node b: env.NCCL_ALGO = 'Ring', node a has <unset>")
    with pytest.raises(AgentError, match="NCCL_ALGO"):
        connect("127.0.0.1", refused.port, KEY, "job7", record(), 5)
    port = Port()
    first = connect("127.0.0.1", port.port, KEY, "job7", record(3), 5)
    with pytest.raises(AgentError):
        connect("127.0.0.1", port.port, KEY, "job7", record(3), 5)
    wait_for(lambda: port.server.dropped["a second link for one member"] == 1, "the second link never dropped")
    assert port.admitted == [3] and port.gone == []
    first.close()


def test_a_replayed_hello_is_refused_the_challenge_is_fresh() -> None:
    port = Port()
    captured: list[bytes] = []
    sock = socket.create_connection(("127.0.0.1", port.port), timeout=5)
    challenge = sock.recv(4096)
    nonce = bytes.fromhex(challenge.split()[1].decode())
    from openclaw_launch.agents.liveness import mac

    body = json.dumps(record(4), sort_keys=True, separators=(",", ":")).encode()
    hello = b"hello " + mac(KEY, "job7", nonce, b"member", body).encode() + b" " + body + b"\n"
    captured.append(hello)
    sock.sendall(hello)
    assert sock.recv(4096).startswith(b"ok ")
    sock.close()
    wait_for(lambda: port.gone == [4], "the first link's close never seen")
    port.raw(captured[0])  # the same bytes on a new connection: another challenge
    wait_for(lambda: port.server.dropped["wrong job secret"] == 1, lambda: f"dropped: {port.server.dropped}")
    assert port.admitted == [4]


def test_an_oversized_or_silent_client_is_dropped() -> None:
    port = Port()
    port.server.hello_timeout_s = 0.3
    port.raw(b"x" * (HELLO_MAX_BYTES + 10), keep=True)
    silent = socket.create_connection(("127.0.0.1", port.port), timeout=5)
    wait_for(
        lambda: port.server.dropped["oversized hello"] == 1 and port.server.dropped["no hello in time"] >= 1,
        lambda: f"dropped: {port.server.dropped}",
    )
    assert silent.recv(4096).startswith(b"openclaw-live/1 ") and silent.recv(4096) == b""  # closed by the port
    silent.close()


def test_many_clients_at_once_never_stop_the_port() -> None:
    port = Port()

    def probe() -> None:
        for _ in range(20):
            with contextlib.suppress(OSError):
                port.raw(b"GET / HTTP/1.0\r\n\r\n")

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    link = connect("127.0.0.1", port.port, KEY, "job7", record(2), 5)
    wait_for(lambda: port.admitted == [2], "member 2 never admitted after the probes")
    link.close()


def test_the_port_listens_on_the_rendezvous_interface_only() -> None:
    port = Port()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", port.port), timeout=2)  # another address of this host
    wildcard = LivenessServer(KEY, "job7", lambda i, r: None, lambda i: None, lambda s: None)
    other = wildcard.start("no-such-host.invalid")  # not this host's: every interface, as before
    socket.create_connection(("127.0.0.2", other), timeout=2).close()


def test_a_beat_is_heard() -> None:
    port = Port()
    link = connect("127.0.0.1", port.port, KEY, "job7", record(5), 5)
    since = time.monotonic()
    wait_for(lambda: port.admitted == [5], "never admitted")
    assert not port.server.heard_since(5, since)
    link.send(b".")
    wait_for(lambda: port.server.heard_since(5, since), "the beat never heard")
    link.close()


def test_admission_refuses_a_differing_variable_and_python_but_not_a_warn_only_key() -> None:
    host = {"env.NCCL_DEBUG": "INFO", "version.python": "3.11.7", "version.torch": "2.5"}
    same = dict(host)
    assert refusal(host, same, "b") is None
    assert refusal(host, {**host, "env.NCCL_DEBUG": "WARN"}, "b") is None  # warns only
    why = refusal(host, {**host, "env.NCCL_ALGO": "Ring"}, "b")
    assert why is not None and "env.NCCL_ALGO" in why and "untouched" in why
    other_python = refusal(host, {**host, "version.python": "3.12.1"}, "b")
    assert other_python is not None and "version.python" in other_python
    no_python = {k: v for k, v in host.items() if k != "version.python"}  # PYTHON_EXEC: asked at the meeting
    assert refusal(host, no_python, "b") is None
