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

This module is the first the entry point loads, so it imports nothing from disk: ``_signal`` and
``sys`` are built into the interpreter (``signal`` would load ``enum``, ~3 ms; ``typing`` ~7 ms).
What is left before ``install`` is the interpreter's own start and its ``site`` import, where
Python's default SIGINT handler raises ``KeyboardInterrupt`` (docs/container.md, "Signals at
start-up", has the window as measured).
"""

import _signal
import sys

#: torchrun's four stopping signals: the ones whose loss before the job starts matters.
EARLY_SIGNALS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)

_pending: list[int] = []
_armed = False


class StartSignal(BaseException):
    """A stopping signal before the job's own handling was in place (a BaseException: no ``except
    Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum: int, _frame: object) -> None:
    _pending.append(signum)
    if _armed:
        raise StartSignal(signum)


def install() -> None:
    """Catch ``EARLY_SIGNALS`` (those ignored by whoever started us stay ignored: nohup's SIGHUP)."""
    for sig in EARLY_SIGNALS:
        if _signal.getsignal(sig) != _signal.SIG_IGN:
            _signal.signal(sig, _on_signal)


def arm() -> None:
    """The imports are done: a recorded signal, and any from now on until launch installs its own
    handling, raises ``StartSignal``."""
    global _armed
    _armed = True
    if _pending:
        raise StartSignal(_pending[0])


def exit_for(signum: int) -> None:
    """One line and exit 128+N (a shell's code for a signal)."""
    import signal

    name = signal.Signals(signum).name
    text = "interrupted" if signum == signal.SIGINT else f"received {name} outside the job's supervision; exiting"
    try:
        sys.stderr.write(f"openclaw-launch: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # stderr closed (2>&-): the exit code tells
        pass
    sys.exit(128 + signum)  # what was started on the way was undone as the exception passed
