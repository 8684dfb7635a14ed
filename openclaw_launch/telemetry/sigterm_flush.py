"""A rank stopped by the launcher keeps its steps: SIGTERM flushes the recorder's batch, then ends
the process as SIGTERM would, also when the main thread is blocked in a C call (a collective).

Python runs a signal handler only when the main thread runs Python, so the wakeup fd (set only when
none is) tells the recorder's progress thread too, which then flushes and ends the process itself.
A handler the script installs later replaces ours and is the one that runs (its exit then flushes
through ``atexit``); the thread then only flushes.

The flush here never waits long (``flush`` takes the longest wait for the recorder's lock, and gives up
after it): the handler may interrupt the main thread inside the recorder's own flush, holding its
lock, and a wait for that lock would never end; the rank then outlived SIGTERM until the launcher's
SIGKILL (``--grace-period-s``). That moment's batch is lost; SIGTERM still ends the process.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

FLUSH_WAIT_S = 0.5  # SIGTERM's flush waits at most this long for the recorder's lock, then ends anyway


class SigtermFlush:
    """``flush`` on SIGTERM, from the main thread's handler or from the thread that reads ``wakeup``.
    ``flush(wait_s)`` waits at most ``wait_s`` for what it needs (the recorder's lock), else skips."""

    def __init__(self, flush: Callable[[float], None]) -> None:
        self._flush = flush
        self.wakeup: int | None = None  # read end of the signal wakeup pipe, once armed

    def arm(self) -> None:
        """From the main thread, while SIGTERM has its default action."""
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, self._on_signal)
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            previous = -2
        if previous != -1:  # someone else's: leave it (the handler alone flushes)
            if previous >= 0:
                signal.set_wakeup_fd(previous)
            os.close(r)
            os.close(w)
            return
        self.wakeup = r

    def woken(self) -> None:
        """(The progress thread.) The wakeup fd is readable: on a SIGTERM, flush and end, also while
        the main thread is blocked in a C call (a collective) or waits in its own handler."""
        assert self.wakeup is not None
        if signal.SIGTERM in os.read(self.wakeup, 512):
            self._flush(FLUSH_WAIT_S)
            if signal.getsignal(signal.SIGTERM) == self._on_signal:  # the script kept SIGTERM's default
                import ctypes  # signal.signal works only on the main thread: the C call sets the default

                ctypes.CDLL(None).signal(int(signal.SIGTERM), 0)  # 0 = SIG_DFL
                _end_by_sigterm()

    def _on_signal(self, signum: int, frame: object) -> None:
        """The main thread's handler: flush, then SIGTERM's default action."""
        self._flush(FLUSH_WAIT_S)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _end_by_sigterm()


def _end_by_sigterm() -> None:
    """SIGTERM (its default action now) to this very thread, unblocked here: the process ends as
    SIGTERM ends it. Should it still run (a mask this thread cannot change), the exit code says SIGTERM."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)
