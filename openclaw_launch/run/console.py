"""The launcher's console: writes that never block supervision.

A launcher whose stdout is a pipe nobody reads (a paused pager, Ctrl-S, a stalled log shipper) must
still reap, forward signals, tear down and restart. ``Console`` wraps a text stream; when it has a
file descriptor, text is queued and written only as far as the descriptor takes it without
blocking (``poll`` says writable, then at most ``PIPE_BUF`` bytes, which a pipe then takes whole).
The queue is bounded: when the reader cannot keep up, whole writes (lines) are dropped and counted,
and once the console moves again one line says how many and where the full logs are. The per-rank
log files are written elsewhere and lose nothing.

A stream without a descriptor (``io.StringIO`` in tests) is written directly.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import select
import time
from collections import deque
from typing import TextIO

PIPE_BUF = 4096  # POSIX minimum; a pipe that polls writable takes this many bytes without blocking
DEFAULT_QUEUE_BYTES = 1 << 20  # beyond this, text is dropped once the reader has stalled ...
HARD_QUEUE_BYTES = 64 << 20  # ... and beyond this in any case
STALL_S = 2.0  # a reader that took nothing for this long has stalled (a paused pager, Ctrl-S)


class Console(io.TextIOBase):
    """A text stream that queues instead of blocking. ``pending`` says whether text waits."""

    def __init__(
        self,
        stream: TextIO,
        max_queue: int = DEFAULT_QUEUE_BYTES,
        logs_hint: str | None = None,
        hard_queue: int = HARD_QUEUE_BYTES,
        stall_s: float = STALL_S,
    ) -> None:
        super().__init__()
        self.stream = stream
        self.max_queue = max_queue  # a slow reader gets up to hard_queue; a stalled one this much
        self.hard_queue = max(hard_queue, max_queue)
        self.stall_s = stall_s
        self._progress = time.monotonic()  # when the reader last took something
        self.logs_hint = logs_hint  # where the full output is, for the "lines dropped" line
        self.dropped_lines = 0  # in total
        self._unreported = 0  # dropped since the last notice
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._gone = False  # closed or broken: every write is dropped silently
        encoding = getattr(stream, "encoding", None) or "utf-8"
        try:
            self._encoder = codecs.getincrementalencoder(encoding)(errors="backslashreplace")
        except LookupError:
            self._encoder = codecs.getincrementalencoder("utf-8")(errors="backslashreplace")
        self._fd = _fileno(stream)
        self._chunk = PIPE_BUF
        if self._fd is not None and os.isatty(self._fd):
            self._chunk = 256  # a terminal polls writable with this much room (n_tty's WAKEUP_CHARS)
        if self._fd is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()  # what Python buffered before us goes first

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if self._gone or not text:
            return len(text)
        if self._fd is None:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                self._gone = True
            return len(text)
        data = self._encoder.encode(text)
        if self._queued + len(data) > self.max_queue:
            self._pump()  # the reader may have taken some; if it is merely slow, keep queuing
        stalled = time.monotonic() - self._progress >= self.stall_s
        if self._queued + len(data) > (self.max_queue if stalled else self.hard_queue):
            self._unreported += max(text.count("\n"), 1)
            self.dropped_lines += max(text.count("\n"), 1)
            self._pump()
            return len(text)
        self._queue.append(data)
        self._queued += len(data)
        self._pump()
        return len(text)

    def flush(self) -> None:
        """Write what the descriptor takes now; never blocks."""
        self._pump()

    def drain(self, timeout_s: float) -> bool:
        """At the end of the run: wait at most ``timeout_s`` for the queue to go out. True if it did."""
        deadline = time.monotonic() + timeout_s
        while self._queue and not self._gone:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._fd is not None and _writable(self._fd, left):
                self._pump()
        return not self._queue

    def _pump(self) -> None:
        if self._fd is None or self._gone:
            return
        while True:
            self._notice()
            if not self._queue:
                self._progress = time.monotonic()  # nothing waits: nothing can be stalled
                return
            if not _writable(self._fd, 0):
                return
            head = self._queue[0]
            try:
                n = os.write(self._fd, head[: self._chunk])
            except BlockingIOError:
                return
            except OSError:  # EPIPE, EBADF, EIO: the console is gone; supervision goes on
                self._gone = True
                self._queue.clear()
                self._queued = 0
                return
            self._queued -= n
            self._progress = time.monotonic()
            if n == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[n:]

    def _notice(self) -> None:
        """Once the console has room again: how many lines it missed, and where they are."""
        if not self._unreported or self._queued + 200 > self.max_queue // 2:
            return
        where = f", full logs in {self.logs_hint}" if self.logs_hint else ""
        notice = f"openclaw-launch: console: {self._unreported} line(s) dropped (output not read fast enough){where}\n"
        self._unreported = 0
        data = notice.encode()
        self._queue.append(data)
        self._queued += len(data)


def _fileno(stream: TextIO) -> int | None:
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


def _writable(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(int(timeout_s * 1000))
    except OSError:
        return False
    return any(ev & (select.POLLOUT | select.POLLERR | select.POLLHUP) for _, ev in events)


def wrap(stream: TextIO | None, logs_hint: str | None = None) -> TextIO | None:
    """``stream`` as a ``Console`` (unchanged if it already is one, None stays None)."""
    if stream is None or isinstance(stream, Console):
        return stream
    return Console(stream, logs_hint=logs_hint)  # type: ignore[return-value]


def dropped_lines(stream: object) -> int:
    """Lines a ``Console`` dropped (0 for any other stream)."""
    return stream.dropped_lines if isinstance(stream, Console) else 0
