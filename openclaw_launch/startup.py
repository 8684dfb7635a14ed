"""The launcher's start-up signals: ``openclaw_launch/__main__.py`` (the entry point) catches the
stopping signals here before anything else is imported.

As a container's PID 1 (``unshare --pid``, ``docker run`` without ``--init``) the kernel drops every
signal whose disposition is the default, so a SIGTERM that arrives while click, yaml and the
launcher's modules load (~0.1 s) would be lost and the container would wait for SIGKILL; a Ctrl-C
there would be a traceback out of an import. Here a handler records the signal while the imports
run; once they are done, such a signal ends the launcher (exit 128+N, one line) until
``job/launch.py`` installs the job's own handling, and again once that is restored at its end.
Nothing of the job is running at those points (what was made on the way is undone as the exception
passes).
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

#: torchrun's four stopping signals: the ones whose loss before the job starts matters.
EARLY_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

_pending: list[int] = []
_armed = False


class StartSignal(BaseException):
    """A stopping signal before the job's own handling was in place (a BaseException: no ``except
    Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    _pending.append(signum)
    if _armed:
        raise StartSignal(signum)


def install() -> None:
    """Catch ``EARLY_SIGNALS`` (those ignored by whoever started us stay ignored: nohup's SIGHUP)."""
    for sig in EARLY_SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, _on_signal)


def arm() -> None:
    """The imports are done: a recorded signal, and any from now on until launch installs its own
    handling, raises ``StartSignal``."""
    global _armed
    _armed = True
    if _pending:
        raise StartSignal(_pending[0])


def exit_for(signum: int) -> None:
    """One line and exit 128+N (a shell's code for a signal)."""
    name = signal.Signals(signum).name
    text = "interrupted" if signum == signal.SIGINT else f"received {name} outside the job's supervision; exiting"
    try:
        sys.stderr.write(f"openclaw-launch: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed (2>&-): the exit code tells
        pass
    sys.exit(128 + signum)  # what was started on the way was undone as the exception passed
