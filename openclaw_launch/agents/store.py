"""The agents' meeting place: torch.distributed's TCPStore, hosted by the first node's launcher on
its own port (not MASTER_PORT). torch is imported here and only here, only by the launcher that
hosts it: the other nodes' agents are clients in the standard library (agents/tcpstore_client.py),
and a one-node launch never pays for it.

TCPStore has no authentication. With ``OPENCLAW_JOB_SECRET`` on every node, every text value the
agents write carries an HMAC-SHA256 of its key and text under the job's secret (``sealed``), and a
value read without one that matches stops the node with one line naming the key: a client without
the secret can still read every value, overwrite or delete one (the job stops) and add to the
counters (``add``: arrivals, keep-alives), but forges no verdict, fate, fingerprint, claim or port
(docs/multinode.md, "Who may speak to the agents' store").

Who hosts it: node rank 0 when the ranks are given; for node ranks by arrival (c10d without
``--node-rank``), torchrun's c10d rule: a launcher whose host is the endpoint's (``localhost``, a
loopback address, or one of this host's names and addresses) tries to listen, and becomes a client
if the port is taken (another launcher on that host hosts it).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import socket
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from openclaw_launch.agents.job_secret import SECRET_ENV, JobKey
from openclaw_launch.errors import OpenclawError

PREFIX = "openclaw/"
_NOFILE_UNLIMITED_HARD = 1 << 20  # the store host's open files when the hard limit is unlimited (nr_open)
_HOST_PAUSE_S = 0.05  # the host's own ``wait``: its pause between its two looks


class AgentError(OpenclawError):
    """The agents could not meet, or do not agree: nothing was started (exit 2)."""


def import_tcpstore() -> Any:
    """torch's TCPStore, or with ``OPENCLAW_AGENT_STORE_SERVER`` set its stand-in whose stores that
    process holds (agents/served_store.py: the tests' one torch import for every launcher).

    c10d logs every failed connect as a C++ warning with a trace; the launcher says what matters
    itself. The level is read when torch loads; the workers' environment is left as it was."""
    import sys

    from openclaw_launch.agents import served_store

    if served_store.SERVER_ENV in os.environ:
        return served_store.served_tcpstore(os.environ[served_store.SERVER_ENV])
    quiet = "torch" not in sys.modules and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        from torch.distributed import TCPStore
    finally:
        if quiet:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    return TCPStore


def is_this_host(addr: str) -> bool:
    """``addr`` (a name or an address) is this machine: torchrun's ``_matches_machine_hostname``,
    over this host's interface addresses (agents/identity.py) and its name's."""
    import ipaddress
    import socket

    from openclaw_launch.agents.identity import local_identity

    if addr == "localhost":
        return True
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(addr.split("%")[0]).is_loopback:
            return True
    names, local = local_identity()
    if addr in names:
        return True
    try:
        theirs = {info[4][0] for info in socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return False
    return bool(theirs & set(local))


def listen_on(port: int) -> socket.socket:
    """A socket listening on ``port`` on every address (IPv6 and IPv4 where the host has both, as
    TCPStore's own server), with SO_REUSEADDR as TCPStore's (a free port this launcher holds, and a
    port a finished store left in TIME_WAIT, can be taken). Bound here, before torch is imported:
    a port in use is known at once, and the store is made on it (``master_listen_fd``). Raises the
    last ``OSError`` (EADDRINUSE: someone listens there)."""
    last: OSError | None = None
    for family in (socket.AF_INET6, socket.AF_INET):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as e:  # no IPv6 on this host
            last = e
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::" if family == socket.AF_INET6 else "", port))
            sock.listen(socket.SOMAXCONN)
            return sock
        except OSError as e:
            sock.close()
            last = e
            if e.errno == errno.EADDRINUSE:
                break
    assert last is not None
    raise last


def _open_files_for_every_node() -> None:
    """The store's host (this helper process) holds a connection per node, and the elastic liveness
    port another: the common soft limit of 1024 open files would refuse nodes past about 500. Raised
    to the hard limit here, in the helper only (the workers are not its children)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else _NOFILE_UNLIMITED_HARD
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def open_store(addr: str, port: int, host: bool | None, timeout_s: float) -> AgentStore:
    """The store at ``addr:port``; ``host`` None: host it by the c10d rule above (the port bound
    first: a launcher that finds it taken is a client and never imports torch)."""
    if host is not None:
        return AgentStore(addr, port, host, timeout_s)
    if is_this_host(addr):
        try:
            return AgentStore(addr, port, True, timeout_s)
        except AgentError:  # the port is taken: by this job's host (checked as a client), or not
            pass
    return AgentStore(addr, port, False, timeout_s)


class AgentStore:
    """Keys are namespaced (``PREFIX`` + ``scope`` + key; an elastic job's worlds each have a scope of
    their own, agents/elastic.py); values are text, sealed under the job's secret when there is one
    (counters are not: ``add``, ``set_counter``, ``get_counters``). Blocking calls: use from one
    thread at a time."""

    def __init__(self, addr: str, port: int, is_host: bool, timeout_s: float) -> None:
        self.addr, self.port, self.is_host = addr, port, is_host
        self.scope = ""
        self._seal_key = _seal_key(os.environ)
        self._listener: socket.socket | None = None
        try:
            if is_host:  # the host listens on every interface
                from openclaw_launch.agents import served_store

                _open_files_for_every_node()

                served = served_store.SERVER_ENV in os.environ  # the serving process binds it
                self._listener = None if served else listen_on(port)
                on_socket = {} if self._listener is None else {"master_listen_fd": self._listener.fileno()}
                tcp_store = import_tcpstore()
                self._store: Any = tcp_store(
                    addr, port, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False, **on_socket
                )
            else:
                from openclaw_launch.agents.tcpstore_client import TCPStoreClient

                self._store = TCPStoreClient(addr, port, timedelta(seconds=timeout_s))
        except Exception as e:  # DistNetworkError, RuntimeError: one line, not a C++ trace
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if is_host:
                if self._listener is not None:
                    self._listener.close()
                in_use = "EADDRINUSE" in str(e) or getattr(e, "errno", None) == errno.EADDRINUSE
                first = os.strerror(errno.EADDRINUSE) if in_use else first  # ours or c10d's words: one line
                taken = " (in use: another launcher hosts agents there, a second one for node rank 0?)"
                raise AgentError(
                    f"cannot listen on port {port}{taken if in_use else ''}: {first}; "
                    "check --agent-port; started nothing"
                ) from None
            raise AgentError(
                f"cannot reach the first node's agent at {addr}:{port} within {timeout_s:g} s ({first}); "
                "check --agent-port (or the --rdzv-endpoint port) and that the first node's launcher runs"
            ) from None

    def within(self, scope: str) -> AgentStore:
        """The same connection, keys under ``scope`` (one thread at a time still)."""
        view = copy.copy(self)
        view.scope = scope
        return view

    def set_timeout(self, seconds: float) -> None:
        self._store.set_timeout(timedelta(seconds=seconds))

    def set(self, key: str, value: str) -> None:
        full = PREFIX + self.scope + key
        self._store.set(full, self._sealed(full, value.encode()))

    def get(self, key: str) -> str:
        full = PREFIX + self.scope + key
        return self._opened(full, bytes(self._store.get(full)))

    def has(self, keys: Sequence[str]) -> bool:
        return bool(self._store.check([PREFIX + self.scope + k for k in keys]))

    def wait(self, keys: Sequence[str], timeout_s: float, wake: socket.socket | None = None) -> bool:
        """True once every key is set; False after ``timeout_s``, or as soon as ``wake`` has something
        to read. A client's is one blocking WAIT on the server, answered the moment the keys are set
        (agents/tcpstore_client.py's ``wait_until``); the host's own (its keys are its own writes: it
        never waits for them in the elastic protocol) looks once, and again after a pause."""
        full = [PREFIX + self.scope + k for k in keys]
        if not self.is_host:
            return bool(self._store.wait_until(full, timeout_s, wake))
        if self._store.check(full):
            return True
        time.sleep(min(timeout_s, _HOST_PAUSE_S))
        return bool(self._store.check(full))

    def first(self, key: str, value: str) -> str:
        """Set ``key`` unless it is set; return what it holds now (the first writer wins)."""
        full = PREFIX + self.scope + key
        return self._opened(full, bytes(self._store.compare_set(full, "", self._sealed(full, value.encode()))))

    def add(self, key: str, amount: int) -> int:
        """Add to a counter (created at 0); the new value: one number per caller, in call order."""
        return int(self._store.add(PREFIX + self.scope + key, amount))

    def set_counter(self, key: str, value: int) -> None:
        """A counter's first value (``add`` goes on from it): never sealed, a number to the store."""
        self._store.set(PREFIX + self.scope + key, str(value).encode())

    def get_counters(self, keys: Sequence[str]) -> list[str]:
        """Counters (``add``, ``set_counter``) as the store holds them: not sealed."""
        return [bytes(v).decode() for v in self._store.multi_get([PREFIX + self.scope + k for k in keys])]

    def get_many(self, keys: Sequence[str]) -> list[str]:
        full = [PREFIX + self.scope + k for k in keys]
        return [self._opened(f, bytes(v)) for f, v in zip(full, self._store.multi_get(full), strict=True)]

    def _sealed(self, full_key: str, value: bytes) -> bytes:
        """``value`` as stored: with the job's secret, ``SEAL`` + the MAC of key and value + a space first."""
        return value if self._seal_key is None else SEAL + _mac(self._seal_key, full_key, value) + b" " + value

    def _opened(self, full_key: str, stored: bytes) -> str:
        """The text of a stored value; with the job's secret, only when its MAC is this job's."""
        if self._seal_key is None:
            return stored.decode()
        import hmac

        head, _, value = stored.partition(b" ")
        if not (
            head.startswith(SEAL) and hmac.compare_digest(head[len(SEAL) :], _mac(self._seal_key, full_key, value))
        ):
            raise AgentError(
                f"the agents' store at {self.addr}:{self.port} holds {full_key[len(PREFIX) :]!r} without this job's "
                f"seal: written by a client without {SECRET_ENV}, or a node has another; set the same {SECRET_ENV} "
                'on every node (docs/multinode.md, "Who may speak to the agents\' store")'
            )
        return value.decode()


#: What a sealed value starts with (the MAC's version).
SEAL = b"sealed1:"


def _seal_key(environ: Mapping[str, str]) -> bytes | None:
    """The values' key from ``OPENCLAW_JOB_SECRET`` (agents/job_secret.py's ``JobKey``), None without it."""
    text = environ.get(SECRET_ENV)
    if not text:
        return None
    return JobKey.of(text, False).key


def _mac(key: bytes, full_key: str, value: bytes) -> bytes:
    import hashlib
    import hmac

    return hmac.new(key, b"openclaw-store/1\0" + full_key.encode() + b"\0" + value, hashlib.sha256).hexdigest().encode()
