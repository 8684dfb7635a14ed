"""Pseudo-terminals for the workers when the launcher writes to a terminal.

Under torchrun the workers write to the user's terminal itself: ``isatty()`` is true, tqdm and rich
draw live bars in colour. Here each rank's stream goes through the launcher (rank prefix, log file,
the stderr tail of the root cause), so the launcher gives the worker's stdout a pty of its own when
its own stdout is a terminal, and the worker's stderr another when its own stderr is one: two
streams stay two streams (one pty for both would mix them, as a real terminal does, and lose the
per-stream logs and the stderr tail); a stream the launcher does not show (``--redirects``,
``--local-ranks-filter``), one whose launcher stream is no terminal, and any where no pty can be
had (no devpts, the pty limit) is a pipe.

The pty only carries bytes: output processing is off on its worker side (no ``\\n`` -> ``\\r\\n``),
so the log holds exactly what the worker wrote and the launcher's own terminal does the rest. Its
window size is the launcher's terminal's less the rank prefix's width (a full-width bar fits the
line after the prefix instead of wrapping), at spawn and after (SIGWINCH in the launcher resizes
every rank's pty). It is not the worker's controlling terminal (workers keep their own session,
for ``killpg``): Ctrl-C reaches the launcher, which stops the job, and no worker is sent SIGWINCH
by the kernel, as under torchrun, whose workers run in their own session too; a program that wants
the size reads it (``os.get_terminal_size``), as tqdm and rich do.

Some read it elsewhere first: rich measures stdin before stdout (its ``_STD_STREAMS``: 0, 1, 2), and
a worker's stdin is the user's terminal, wider than its pty by the prefix; rich, click and
``shutil.get_terminal_size`` take ``COLUMNS``/``LINES`` over any terminal, and an exported
``COLUMNS`` is the user's whole width. So where the worker's stdin is a terminal, or ``COLUMNS`` is
inherited, a worker with a pty also gets ``COLUMNS`` and ``LINES`` of its pty's size at spawn
(``size_env``); a later resize reaches the pty only (the variables are read once, at start).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from openclaw_launch.run import console

RESIZE_SIGNAL = signal.SIGWINCH
_WINSIZE = "HHHH"  # struct winsize: rows, columns, x pixels, y pixels


@dataclass(frozen=True)
class Terminal:
    """Which of one worker's streams get a pty, and where the window size comes from."""

    stdout: bool
    stderr: bool
    size_fd: int  # the launcher's terminal: its window size is the ptys', less ...
    margin_columns: int = 0  # ... the rank prefix's width: what the worker draws fits the line after it


@dataclass(frozen=True)
class LauncherTerminal:
    """The launcher's console streams that are terminals (their descriptors; None: not one)."""

    stdout_fd: int | None
    stderr_fd: int | None

    @classmethod
    def of(cls, stdout: TextIO, stderr: TextIO) -> LauncherTerminal | None:
        found = cls(_tty_fd(stdout), _tty_fd(stderr))
        return found if found.stdout_fd is not None or found.stderr_fd is not None else None

    @property
    def size_fd(self) -> int:
        """The terminal whose window size the workers' ptys take."""
        fd = self.stdout_fd if self.stdout_fd is not None else self.stderr_fd
        assert fd is not None, "LauncherTerminal.of returns None without a terminal"
        return fd

    def for_worker(self, shown: Mapping[str, bool], prefix: str) -> Terminal | None:
        """A pty for each stream shown on a launcher stream that is a terminal; None: pipes only."""
        stdout = self.stdout_fd is not None and shown["stdout"]
        stderr = self.stderr_fd is not None and shown["stderr"]
        return Terminal(stdout, stderr, self.size_fd, len(prefix)) if stdout or stderr else None


def console_fd(stream: TextIO | None) -> int | None:
    """The descriptor a console stream writes to (through run/console.Console); None: it has none."""
    if isinstance(stream, console.Console):
        stream = stream.stream
    try:
        return stream.fileno() if stream is not None else None
    except (OSError, ValueError, AttributeError):  # io.StringIO, a closed stream
        return None


def _tty_fd(stream: TextIO) -> int | None:
    fd = console_fd(stream)
    return fd if fd is not None and os.isatty(fd) else None


def window_size(fd: int, margin_columns: int = 0) -> bytes | None:
    """The terminal's ``struct winsize`` less ``margin_columns`` (at least one column is left);
    None when ``fd`` is no terminal (any more)."""
    try:
        raw = fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(struct.calcsize(_WINSIZE)))
    except OSError:
        return None
    rows, columns, x_pixels, y_pixels = struct.unpack(_WINSIZE, raw)
    if not margin_columns or not columns:  # 0 columns: the size is unknown, pass it on as it is
        return raw
    left = max(columns - margin_columns, 1)
    return struct.pack(_WINSIZE, rows, left, x_pixels * left // columns, y_pixels)


def size_env(size: bytes | None, environ: Mapping[str, str]) -> dict[str, str]:
    """``COLUMNS`` and ``LINES`` of a worker's pty of ``size`` (``window_size``'s), for readers that
    look at them or at stdin before the pty (the module's docstring); none where nothing would
    mislead them (stdin no terminal and no ``COLUMNS`` inherited) or the size is unknown."""
    if size is None or not (os.isatty(0) or "COLUMNS" in environ):
        return {}
    rows, columns, _, _ = struct.unpack(_WINSIZE, size)
    return {"COLUMNS": str(columns), "LINES": str(rows)} if columns and rows else {}


def set_window_size(fd: int, size: bytes) -> None:
    """Resize a pty (its master side); the worker side sees it at once."""
    try:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, size)
    except OSError as exc:
        if exc.errno not in (errno.EIO, errno.ENOTTY, errno.EBADF):
            raise


def open_pty(size: bytes | None) -> tuple[int, int] | None:
    """A pty pair (master, worker side), both close-on-exec (the worker gets its side as stdout or
    stderr only), the master non-blocking, output processing off, ``size`` as its window size.
    None where none can be had (no devpts in a container, the pty limit): the stream is a pipe."""
    try:
        master, worker_side = os.openpty()  # opened with O_NOCTTY: never our controlling terminal
    except OSError:
        return None
    try:
        attrs = termios.tcgetattr(worker_side)
        attrs[1] &= ~termios.OPOST  # oflag: the bytes as written (ONLCR would make \n into \r\n)
        termios.tcsetattr(worker_side, termios.TCSANOW, attrs)
        if size is not None:
            set_window_size(master, size)
        os.set_blocking(master, False)
    except BaseException:
        os.close(master)
        os.close(worker_side)
        raise
    return master, worker_side


def read_master(fd: int, limit: int) -> bytes | None:
    """Bytes read, ``b""`` at the end (EIO: every writer of the worker side is gone), None when
    nothing is there now."""
    try:
        return os.read(fd, limit)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return b""
        raise
