"""The supervisor's event loop: one wait over the signal wake-up descriptor, the workers' output
pipes and the participants' descriptors, and one heap of timers.

Nothing here blocks but ``OsLayer.wait_fds`` (with the next timer's timeout), so a worker's exit,
a line of output and an agent's message are all seen at once and an idle launcher uses no CPU.
A worker's stream is a pty when the launcher's is a terminal (run/terminal.py): read here as a pipe
(EIO once the worker is gone is its end), resized here on SIGWINCH.
"""

from __future__ import annotations

import heapq
import itertools
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import TextIO

from openclaw_launch.run import console
from openclaw_launch.run.osproc import OsLayer
from openclaw_launch.run.terminal import RESIZE_SIGNAL, LauncherTerminal, Terminal
from openclaw_launch.run.worker_output import WorkerStream

_MAX_DRAIN = 16 << 20  # bytes read from a pipe after its worker is gone, at most
_MAX_PENDING = 1 << 20  # bytes read from each pipe when a worker failed, before it is judged
_CONSOLE_RETRY_S = 0.05  # a console that did not take everything is retried this often


class EventLoop:
    def __init__(
        self,
        os_layer: OsLayer,
        readers: Mapping[int, Callable[[], None]],
        consoles: tuple[TextIO, ...],
    ) -> None:
        self.os = os_layer
        self.wakeup_fd = -1  # signal.set_wakeup_fd's, once the supervisor installed its handlers
        self.readers = dict(readers)  # fd -> call when readable (the participants', for the whole job)
        self.consoles = consoles
        self.streams: dict[int, WorkerStream] = {}  # the workers' pipes of the open attempt
        self.terminal = LauncherTerminal.of(*consoles) if len(consoles) == 2 else None  # (stdout, stderr)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def install_signals(self, signals: Iterable[int]) -> None:
        """Route ``signals`` (and SIGWINCH when the workers get ptys) to the wake-up descriptor."""
        resize = (RESIZE_SIGNAL,) if self.terminal is not None else ()
        self.wakeup_fd = self.os.install_signals((*signals, *resize))

    def terminal_for(self, shown: Mapping[str, bool], prefix: str) -> Terminal | None:
        """Which streams of a worker get a pty: those shown on a launcher stream that is a terminal."""
        return self.terminal.for_worker(shown, prefix) if self.terminal is not None else None

    def watch_readers(self) -> None:
        for fd in self.readers:
            self.os.watch_fd(fd)

    def unwatch_readers(self) -> None:
        for fd in self.readers:
            self.os.unwatch_fd(fd)

    # ---- one step --------------------------------------------------------------------------------

    def wait(self, timeout: float | None) -> list[int]:
        """Wait for a descriptor (at most ``timeout`` s), feed the ready pipes, call the ready
        readers; return the signals that arrived (SIGCHLD left out: reaping is the caller's)."""
        signals: list[int] = []
        for fd in self.os.wait_fds(timeout):
            if fd == self.wakeup_fd:
                signals += [s for s in self.os.drain_signals() if s != signal.SIGCHLD]
                if RESIZE_SIGNAL in signals and self.terminal is not None:
                    signals = [s for s in signals if s != RESIZE_SIGNAL]
                    self.os.resize_terminals(self.terminal.size_fd)
            elif fd in self.streams:
                self._read(self.streams[fd])
            elif fd in self.readers:
                self.readers[fd]()
        return signals

    def next_timeout(self) -> float | None:
        timeout = None if not self._timers else self._timers[0][0] - self.os.monotonic()
        if any(isinstance(c, console.Console) and c.pending for c in self.consoles):
            timeout = _CONSOLE_RETRY_S if timeout is None else min(timeout, _CONSOLE_RETRY_S)  # queued text
        return timeout

    def run_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self.os.monotonic():
            heapq.heappop(self._timers)[2]()

    def flush_consoles(self) -> None:
        for stream in self.consoles:
            if isinstance(stream, console.Console):
                stream.flush()

    # ---- timers ----------------------------------------------------------------------------------

    def at(self, delay_s: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (self.os.monotonic() + delay_s, next(self._seq), callback))

    def repeat(self, interval_s: float, callback: Callable[[], None], while_: Callable[[], bool]) -> None:
        """Call ``callback`` every ``interval_s`` for as long as ``while_()`` holds."""

        def tick() -> None:
            callback()
            if while_():
                self.at(interval_s, tick)

        self.at(interval_s, tick)

    def clear_timers(self) -> None:
        self._timers = []

    # ---- the workers' pipes ----------------------------------------------------------------------

    def add_stream(self, stream: WorkerStream) -> None:
        self.streams[stream.fd] = stream
        self.os.watch_fd(stream.fd)

    def drain_streams(self) -> None:
        """What is in every pipe now, without blocking (an unkillable process may still hold it) and
        bounded (a writer we could not kill, e.g. exempt, may keep it full); then close them."""
        for stream in list(self.streams.values()):
            left = _MAX_DRAIN
            while left > 0 and (data := self.os.read_fd(stream.fd)):
                stream.feed(data)
                left -= len(data)
            self._close(stream)

    def read_pending(self) -> None:
        """What every pipe holds now (at most ``_MAX_PENDING`` bytes each), without blocking or closing
        one: all a worker wrote before its exit was seen, for its stderr tail."""
        for stream in list(self.streams.values()):
            left = _MAX_PENDING
            while left > 0 and (data := self.os.read_fd(stream.fd)):
                stream.feed(data)
                left -= len(data)

    def _read(self, stream: WorkerStream) -> None:
        data = self.os.read_fd(stream.fd)
        if data is None:
            return
        if data:
            stream.feed(data)
        else:
            self._close(stream)

    def _close(self, stream: WorkerStream) -> None:
        stream.finish()
        self.os.unwatch_fd(stream.fd)
        self.os.close_fd(stream.fd)
        del self.streams[stream.fd]
