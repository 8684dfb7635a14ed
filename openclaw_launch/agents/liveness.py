"""The first node's liveness port (agents/elastic.py's rendezvous), as a protocol with an identity.

Every other member of an elastic job keeps one TCP connection to it: the first node sees a member's
launcher die when the connection closes. Before this port counts a connection as a member, the
connection proves that it holds the job's secret (``JobKey``): the port sends a fresh challenge
(``openclaw-live/1 <nonce>``), the member answers ``hello <mac> <record>`` (its member id, launcher
token, standby flag, config node and admission fingerprint, agents/admission.py), the MAC an
HMAC-SHA256 over the protocol, the direction, the rendezvous id, the challenge and the record; the
port answers ``ok <mac>`` or ``no <mac> <why>`` (the member checks that MAC too: the answer is the
job's). After that a member sends one ``.`` per beat while its launcher's loop ticks, and answers
the port's ``?`` with ``!`` once its launcher has ticked twice since (agents/elastic.py: a standby
that does not answer is skipped when it is needed).

Anything else is dropped and counted, never trusted: a line that is not the protocol (an HTTP probe,
a port scanner), a wrong MAC (another job, a forged ``N``), a hello bigger than ``HELLO_MAX_BYTES``
or later than ``HELLO_TIMEOUT_S``, a second link for one member, more than ``PENDING_MAX`` half-open
connections (the oldest goes). Nothing a client sends can raise out of the port's thread, and the
port calls into the rendezvous (``admit``, ``gone``) only for an authenticated member.

The secret is ``OPENCLAW_JOB_SECRET`` when every node has it (then it never travels), else a token
the first node draws and publishes in the rendezvous's store. torch's TCPStore has no authentication
of its own: a client that speaks the store protocol can read that token; the secret keeps out every
client that does not (probes, scanners, another job, a stray line), and ``OPENCLAW_JOB_SECRET``
keeps out the rest from this port.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openclaw_launch.agents.job_secret import SECRET_ENV, JobKey
from openclaw_launch.agents.store import AgentError

PROTOCOL = b"openclaw-live/1"
HELLO_MAX_BYTES = 64 * 1024  # a hello holds one node's admission fingerprint: a few kB
HELLO_TIMEOUT_S = 10.0  # a connection that has not said hello by then is dropped
PENDING_MAX = 64  # half-open connections kept at once (the oldest beyond is dropped)
BEAT = b"."
PING = b"?"  # the first node asks a waiting member whether its launcher runs
PONG = b"!"  # its answer: two launcher ticks came after the question (a frozen launcher has none)
_SELECT_S = 0.5


def mac(key: JobKey, rdzv_id: str, nonce: bytes, direction: bytes, body: bytes) -> str:
    return hmac.new(key.key, b"\0".join([PROTOCOL, direction, rdzv_id.encode(), nonce, body]), "sha256").hexdigest()


@dataclass
class _Conn:
    sock: socket.socket
    peer: str
    nonce: bytes
    deadline: float
    buf: bytes = b""
    member_id: int | None = None  # set once authenticated


@dataclass
class LivenessServer:
    """The port's thread. ``admit(member_id, record)``: None to admit the member, else why not (the
    member is told); ``joined(member_id)``: its link is up (it may be asked, ``ask``);
    ``gone(member_id)``: an admitted member's link closed."""

    key: JobKey
    rdzv_id: str
    admit: Callable[[int, dict[str, Any]], str | None]
    gone: Callable[[int], None]
    say: Callable[[str], None]
    joined: Callable[[int], None] = lambda member_id: None  # an admitted member's link is up (told "ok")
    hello_timeout_s: float = HELLO_TIMEOUT_S
    dropped: Counter[str] = field(default_factory=Counter)
    _heard: dict[int, float] = field(default_factory=dict)
    _answered: dict[int, float] = field(default_factory=dict)
    _linked: dict[int, socket.socket] = field(default_factory=dict)
    # epoll where there is one: select() stops at descriptor 1024, and each round would cost every link
    _selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    _pending: dict[socket.socket, _Conn] = field(default_factory=dict)  # not yet authenticated (each round's scan)

    def start(self, bind_addr: str) -> int:
        """Listen on ``bind_addr``'s interface where this host has it (else on every one); the port."""
        listener = _listener(bind_addr)
        threading.Thread(target=self._serve, args=(listener,), name="openclaw-members", daemon=True).start()
        return int(listener.getsockname()[1])

    def heard_since(self, member_id: int, since: float) -> bool:
        """A beat (or the hello) of ``member_id`` came after ``since`` (monotonic)."""
        return self._heard.get(member_id, -1.0) > since

    def ask(self, member_id: int) -> None:
        """Ask ``member_id`` whether its launcher runs (``answered_since`` says when it answered)."""
        sock = self._linked.get(member_id)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.send(PING)

    def answered_since(self, member_id: int, since: float) -> bool:
        return self._answered.get(member_id, -1.0) > since

    def summary(self) -> str:
        """What was dropped, for the console at the end ("" when nothing was)."""
        if not self.dropped:
            return ""
        parts = ", ".join(f"{why}: {n}" for why, n in sorted(self.dropped.items()))
        return (
            f"the liveness port dropped {sum(self.dropped.values())} connection(s) that were not this job's ({parts})"
        )

    # ---- the thread ------------------------------------------------------------------------------

    def _serve(self, listener: socket.socket) -> None:
        conns: dict[socket.socket, _Conn] = {}
        self._selector.register(listener, selectors.EVENT_READ)
        while True:
            try:
                self._round(listener, conns)
            except Exception as e:  # a bug must not end the port: the rendezvous needs it
                self._drop_reason(f"error {type(e).__name__}", "?")
                time.sleep(0.05)

    def _round(self, listener: socket.socket, conns: dict[socket.socket, _Conn]) -> None:
        readable = [key.fileobj for key, _ in self._selector.select(_SELECT_S)]
        now = time.monotonic()
        for sock in readable:
            if sock is not listener and sock not in conns:  # closed earlier in this round
                continue
            if sock is listener:
                self._accept(listener, conns, now)
                continue
            conn = conns[sock]
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self._close(conns, conn, "closed before hello" if conn.member_id is None else None)
                continue
            if conn.member_id is not None:
                if BEAT in data:
                    self._heard[conn.member_id] = now
                if PONG in data:
                    self._answered[conn.member_id] = now
                continue
            conn.buf += data
            self._read_hello(conns, conn, now)
        for conn in [c for c in self._pending.values() if c.deadline < now]:
            self._close(conns, conn, "no hello in time")

    def _accept(self, listener: socket.socket, conns: dict[socket.socket, _Conn], now: float) -> None:
        try:
            sock, addr = listener.accept()
        except OSError:
            return
        if len(self._pending) >= PENDING_MAX:
            oldest = min(self._pending.values(), key=lambda c: c.deadline)
            self._close(conns, oldest, "too many half-open connections")
        sock.setblocking(False)
        conn = _Conn(sock, str(addr[0]), secrets.token_bytes(16), now + self.hello_timeout_s)
        conns[sock] = self._pending[sock] = conn
        self._selector.register(sock, selectors.EVENT_READ)
        try:
            sock.send(PROTOCOL + b" " + conn.nonce.hex().encode() + b"\n")
        except OSError:
            self._close(conns, conn, "closed before hello")

    def _read_hello(self, conns: dict[socket.socket, _Conn], conn: _Conn, now: float) -> None:
        if b"\n" not in conn.buf:
            if len(conn.buf) > HELLO_MAX_BYTES:
                self._close(conns, conn, "oversized hello")
            return
        line = conn.buf.split(b"\n", 1)[0]
        parts = line.split(b" ", 2)
        if len(parts) != 3 or parts[0] != b"hello" or len(line) > HELLO_MAX_BYTES:
            self._close(conns, conn, "not the protocol")
            return
        _, their_mac, body = parts
        want = mac(self.key, self.rdzv_id, conn.nonce, b"member", body)
        if not hmac.compare_digest(their_mac, want.encode()):
            self._close(conns, conn, "wrong job secret")
            return
        record = _record(body)
        if record is None:
            self._close(conns, conn, "malformed hello")
            return
        member_id = record["id"]
        if member_id in self._linked:
            self._close(conns, conn, "a second link for one member")
            return
        refused = self.admit(member_id, record)
        if refused is not None:
            self._answer(conn, b"no", body, refused)
            self._close(conns, conn, None)
            return
        self._answer(conn, b"ok", body, "")
        conn.member_id = member_id
        self._pending.pop(conn.sock, None)
        self._linked[member_id] = conn.sock
        self._heard[member_id] = now
        self.joined(member_id)

    def _answer(self, conn: _Conn, verdict: bytes, body: bytes, why: str) -> None:
        text = why.replace("\n", "\\n").encode()
        tag = mac(self.key, self.rdzv_id, conn.nonce, b"host " + verdict, body + b"\0" + text)
        with contextlib.suppress(OSError):
            conn.sock.setblocking(True)
            conn.sock.settimeout(1.0)
            conn.sock.sendall(verdict + b" " + tag.encode() + (b" " + text if text else b"") + b"\n")
            conn.sock.setblocking(False)

    def _close(self, conns: dict[socket.socket, _Conn], conn: _Conn, dropped: str | None) -> None:
        conns.pop(conn.sock, None)
        self._pending.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        if conn.member_id is not None:
            self._linked.pop(conn.member_id, None)
            self.gone(conn.member_id)
        elif dropped is not None:
            self._drop_reason(dropped, conn.peer)

    def _drop_reason(self, why: str, peer: str) -> None:
        self.dropped[why] += 1
        if self.dropped[why] == 1:
            self.say(f"liveness port: dropped a connection from {peer} ({why}); such input is counted, never trusted")


def _record(body: bytes) -> dict[str, Any] | None:
    """The hello's record, every field of its type; None if it is not one."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    kinds = {"id": int, "token": str, "standby": bool, "node": str, "admission": dict}
    if any(not isinstance(data.get(k), t) for k, t in kinds.items()) or isinstance(data["id"], bool):
        return None
    if data["id"] < 1 or not all(isinstance(k, str) and isinstance(v, str) for k, v in data["admission"].items()):
        return None
    return data


def _listener(addr: str) -> socket.socket:
    """A listening socket on the interface of ``addr`` (the rendezvous's host: every member
    connects there) when this host has that address, else on every interface."""
    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        infos = []
    for family, _, _, _, where in infos:
        with contextlib.suppress(OSError):
            return socket.create_server((where[0], 0), family=family)
    return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)


# ---- a member's side --------------------------------------------------------------------------------


def connect(
    addr: str, port: int, key: JobKey, rdzv_id: str, record: Mapping[str, Any], timeout_s: float
) -> socket.socket:
    """A member's authenticated link to the first node's liveness port; ``AgentError`` if the port
    refused it (saying why) or does not speak this job's protocol."""
    where = f"{addr}:{port}"
    try:
        sock = socket.create_connection((addr, port), timeout=timeout_s)
    except OSError as e:
        raise AgentError(f"cannot reach the first node's liveness port at {where}: {e}; started nothing") from None
    try:
        challenge = _line(sock)
        head, _, nonce_hex = challenge.partition(b" ")
        nonce = bytes.fromhex(nonce_hex.decode("ascii", "replace")) if head == PROTOCOL else b""
        if not nonce:
            raise AgentError(f"{where} does not speak the liveness protocol ({PROTOCOL.decode()}); started nothing")
        body = json.dumps(dict(record), sort_keys=True, separators=(",", ":")).encode()
        sock.sendall(b"hello " + mac(key, rdzv_id, nonce, b"member", body).encode() + b" " + body + b"\n")
        answer = _line(sock)
    except (OSError, ValueError) as e:
        sock.close()
        raise AgentError(
            f"the first node's liveness port at {where} ended the link ({e or 'closed'}): it holds another job "
            f"secret ({SECRET_ENV} differs between the nodes?); started nothing"
        ) from None
    verdict, _, rest = answer.partition(b" ")
    tag, _, why = rest.partition(b" ")
    expected = mac(key, rdzv_id, nonce, b"host " + verdict, body + b"\0" + why)
    if verdict not in (b"ok", b"no") or not hmac.compare_digest(tag, expected.encode()):
        sock.close()
        raise AgentError(f"the liveness port at {where} answered as no port of this job; started nothing")
    if verdict == b"no":
        sock.close()
        raise AgentError(why.decode("utf-8", "replace").replace("\\n", "\n"))
    sock.settimeout(1.0)  # beats: a member never waits long on its own link
    return sock


def _line(sock: socket.socket) -> bytes:
    """One line, read a byte at a time: what follows it (the port's ``PING``) stays in the socket."""
    got = bytearray()
    while not got.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ValueError("closed")
        got += chunk
        if len(got) > HELLO_MAX_BYTES:
            raise ValueError("an answer too long")
    return bytes(got[:-1])
