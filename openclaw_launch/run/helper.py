"""Helper processes: where the launcher's threaded work runs, so the launcher forks single-threaded.

The launcher forks and spawns (guardian, cgroup probe, MPS, workers with a ``preexec_fn``); CPython
documents fork with threads as unsafe. So NVML sampling, the metrics server, the stats-file writer
(stats/helper.py) and the agents' store client (agents/store_loop.py) each run in a process forked
from the launcher while it has one thread; inside a helper threads are fine (it never forks).

A fork costs the launcher about 0.4 ms and the helper is ready 1 ms later; a fresh interpreter
(fork+exec ``python -m``) is ready after ~37 ms of CPU (measured on the 2-core test box with the
launcher's imports loaded), so helpers are forked. A helper dies with the launcher: it asks for
SIGKILL when its parent dies (PR_SET_PDEATHSIG), checks that the parent did not die before that,
and exits when the link reaches EOF. It lives in its own session and ignores the launcher's
forwarded signals (Ctrl-C reaches the launcher, which ends its helpers in order).

The link is a Unix stream socket pair that carries typed messages: frozen dataclasses of the helper's
``Vocabulary``, each going one way, in one codec (``LinkCodec``: one JSON object per line). A message
of another vocabulary, or sent the wrong way, is a ``TypeError`` where it is sent, never one the
other end drops. The launcher's side never blocks: a message that does not fit is kept whole in a
bounded buffer (sent with the next one), or dropped and counted once the buffer is full; its read
side goes into the supervisor's event loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, is_dataclass

from openclaw_launch.config.defaults import HANDLED_SIGNALS
from openclaw_launch.config.signals import signal_numbers
from openclaw_launch.single_thread import assert_single_threaded

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PENDING_MAX_BYTES = 4 << 20  # what the launcher keeps for a helper that does not read, at most
CLOSE_TIMEOUT_S = 5.0

_running: dict[int, str] = {}  # pid -> name of every helper this process started and not yet ended


def running_helpers() -> list[int]:
    """The helpers' pids: never a leftover for the supervisor to kill."""
    return list(_running)


class Message:
    """Base of every message a link carries; each is a frozen dataclass of one ``Vocabulary``."""


@dataclass(frozen=True)
class Vocabulary:
    """What the launcher and one kind of helper say to each other: the messages each way."""

    to_helper: tuple[type[Message], ...]
    to_launcher: tuple[type[Message], ...]


class LinkCodec:
    """The link's one codec, at one end: it encodes what this end ``sends`` and decodes what it
    ``receives``. A message is one line, ``{"message": its class's name, "fields": ...}`` with the
    fields as openclaw_launch/codec.py writes them, and read back through the same codec, which
    checks each field against its type."""

    def __init__(self, sends: Iterable[type[Message]], receives: Iterable[type[Message]]) -> None:
        self._sends = frozenset(sends)
        received = tuple(receives)
        self._receives = {cls.__name__: cls for cls in received}
        if len(self._receives) != len(received):
            raise TypeError(f"two messages of one name: {sorted(cls.__name__ for cls in received)}")
        for cls in (*self._sends, *received):
            if not (is_dataclass(cls) and cls.__dataclass_params__.frozen):
                raise TypeError(f"{cls.__name__}: a link's message is a frozen dataclass")

    def encode(self, message: Message) -> bytes:
        if type(message) not in self._sends:
            raise TypeError(f"{type(message).__name__} is no message this end of the link sends")
        from openclaw_launch.codec import to_json  # not at import: the start path needs no link

        line = json.dumps({"message": type(message).__name__, "fields": to_json(message)}, separators=(",", ":"))
        return (line + "\n").encode()

    def decode(self, line: bytes) -> Message:
        """The message on ``line``; a message this end does not receive, or one whose fields are
        not its type's, is an error (the other end is the launcher's own code: a bug)."""
        from openclaw_launch.codec import from_json

        data = json.loads(line)
        cls = self._receives.get(data["message"])
        if cls is None:
            raise TypeError(f"{data['message']!r} is no message this end of the link receives")
        return from_json(cls, data["fields"])


class Link:
    """One end of the socket pair, speaking ``codec``. The launcher's end does not block
    (``blocking=False``); a helper's end blocks and may be used from several threads (sends are
    serialised)."""

    def __init__(self, sock: socket.socket, blocking: bool, codec: LinkCodec) -> None:
        self._sock = sock
        self._blocking = blocking
        self._codec = codec
        sock.setblocking(blocking)
        self._in = b""
        self._out = bytearray()
        self._lock = threading.Lock() if blocking else None
        self.closed = False  # the other end is gone (EOF or an error)
        self.dropped = 0  # messages the launcher's end could not keep

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, message: Message) -> bool:
        data = self._codec.encode(message)
        if self.closed:
            return False
        if self._lock is not None:
            with self._lock:
                try:
                    self._sock.sendall(data)
                except OSError:
                    self.closed = True
                    return False
            return True
        self.flush()
        if len(self._out) + len(data) > PENDING_MAX_BYTES:
            self.dropped += 1
            return False
        self._out += data
        self.flush()
        return True

    def flush(self, timeout_s: float = 0.0) -> bool:
        """Write what is pending, waiting up to ``timeout_s`` (launcher's end). True when all is out."""
        deadline = time.monotonic() + timeout_s
        while self._out and not self.closed:
            try:
                sent = self._sock.send(self._out)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                select.select([], [self._sock], [], left)
                continue
            except OSError:
                self.closed = True
                break
            del self._out[:sent]
        return not self._out

    def receive(self) -> list[Message]:
        """The launcher's end: every whole message there now, without blocking."""
        while not self.closed:
            try:
                chunk = self._sock.recv(65536)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self._in += chunk
        return self._split()

    def wait(self, timeout_s: float | None) -> list[Message]:
        """Block up to ``timeout_s`` (None: forever) for at least one message, or EOF."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            messages = self._split()
            if messages or self.closed:
                return messages
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            readable, _, _ = select.select([self._sock], [], [], left)
            if readable:
                try:
                    chunk = self._sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self.closed = True
                self._in += chunk

    def _split(self) -> list[Message]:
        *lines, self._in = self._in.split(b"\n")
        return [self._codec.decode(line) for line in lines if line]

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()


class Helper:
    """The launcher's handle on one helper process."""

    def __init__(self, pid: int, name: str, link: Link) -> None:
        self.pid, self.name, self.link = pid, name, link
        self._ended = False

    @classmethod
    def fork(
        cls, name: str, main: Callable[[Link], None], vocabulary: Vocabulary, keep_fds: Sequence[int] = ()
    ) -> Helper:
        """Fork a helper running ``main(link)``, the two ends speaking ``vocabulary``; ``name`` is its
        process name (``ps``, 15 chars at most); ``keep_fds`` stay open in it (every other fd but
        stderr is closed). Call while this process has one thread (the reason helpers exist)."""
        assert_single_threaded(f"fork the {name} helper")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:  # the helper: never returns into the caller's stack
            code = 1
            try:
                _become_helper(launcher, name, {theirs.fileno(), *keep_fds})
                main(Link(theirs, blocking=True, codec=LinkCodec(vocabulary.to_launcher, vocabulary.to_helper)))
                code = 0
            except BaseException:  # a bug: say it on the launcher's stderr, which the helper shares
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        _running[pid] = name
        return cls(pid, name, Link(ours, blocking=False, codec=LinkCodec(vocabulary.to_helper, vocabulary.to_launcher)))

    def fileno(self) -> int:
        return self.link.fileno()

    def end(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close the link (the helper exits at EOF) and collect it; SIGKILL after ``timeout_s``.
        Idempotent. The supervisor may have reaped it already (it collects every child)."""
        if self._ended:
            return
        self._ended = True
        self.link.close()
        _running.pop(self.pid, None)
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        try:
            while os.waitpid(self.pid, os.WNOHANG)[0] == 0:  # still ours, unreaped: safe to signal
                if time.monotonic() >= deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    return
                time.sleep(pause)
                pause = min(pause * 2, 0.05)
        except ChildProcessError:
            pass


def _become_helper(launcher: int, name: str, keep_fds: Collection[int]) -> None:
    """Die with the launcher, own session and name, default-ish signals, no inherited fds but the
    link and stderr (a held pipe of the guardian or a worker would keep its reader waiting)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != launcher:  # the launcher died before the prctl
        os._exit(0)
    libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in signal_numbers(HANDLED_SIGNALS):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    low = 3
    for fd in sorted(keep_fds):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
