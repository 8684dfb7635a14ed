"""The supervisor's output streams: the launcher's own stdout and stderr, wrapped so that a slow
reader never blocks supervision (run/console.py), its own lines on stderr, and each worker pipe's
stream (run/worker_output.py) on them.

The streams shown on one console file (the launcher's stdout and stderr on one terminal, or one
pipe with ``2>&1``) share one open line, so a rank's line printed on stdout never lands inside
another's progress bar drawn on stderr.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from typing import BinaryIO, TextIO

from openclaw_launch.run import console
from openclaw_launch.run.worker_output import ConsoleLine, WorkerStream, console_key


class LauncherStreams:
    """The launcher's console streams (None: ``sys.stdout`` / ``sys.stderr`` at call time), with
    ``logs_hint`` (where the workers' logs are) for a console that had to drop lines."""

    def __init__(self, stdout: TextIO | None, stderr: TextIO | None, logs_hint: str | None) -> None:
        self.stdout = console.wrap(stdout or sys.stdout, logs_hint) or sys.stdout
        self.stderr = console.wrap(stderr or sys.stderr, logs_hint) or sys.stderr
        self._lines: dict[object, ConsoleLine] = {}  # per console file: whose line is open

    def say(self, text: str) -> None:
        """A line of the launcher's own on stderr (a warning, the summary); a console that is gone
        stops nothing."""
        try:
            self.stderr.write(text + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass

    def worker_stream(
        self,
        fd: int,
        name: str,
        prefix: str,
        shown: bool,
        log: BinaryIO | None,
        tail: deque[str] | None,
        on_log_error: Callable[[OSError], None],
    ) -> WorkerStream:
        """One worker pipe ``fd`` (its ``name``: stdout or stderr): to ``log``, to the launcher's
        same stream when ``shown`` (each line after ``prefix``), its last lines to ``tail``."""
        target = (self.stdout if name == "stdout" else self.stderr) if shown else None
        line = self._lines.setdefault(console_key(target, name), ConsoleLine())
        return WorkerStream(fd, prefix, target, log, tail, line, on_log_error)
