"""A worker's output on its way out: raw bytes to its log file, prefixed lines to the console, the
last lines of stderr to its tail (for the root cause).

Lines of ranks writing at once are never cut into each other; a progress bar redrawn with ``\\r``
is shown as it is drawn; a log file that cannot be written is dropped (the job and the console go
on) and reported through ``on_log_error``.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO, TextIO

from openclaw_launch.run.terminal import console_fd

if TYPE_CHECKING:
    from openclaw_launch.plan.build import RankPlan

MAX_PARTIAL_LINE = 65536  # a "line" longer than this is emitted in pieces


class ConsoleLine:
    """Which stream's line is open (written without its end yet) on one console stream."""

    owner: WorkerStream | None = None


class WorkerStream:
    """One worker pipe: raw bytes to the log file, prefixed text to the console, whole lines to the
    stderr tail.

    The console gets whole lines, so ranks flooding it at once never cut each other's lines; but a
    line being redrawn with ``\\r`` (a progress bar) is shown as it is written, and a last line
    without a newline at EOF. Another rank writing while such a line is open ends it first.
    """

    def __init__(
        self,
        fd: int,
        prefix: str,
        console: TextIO | None,
        log: BinaryIO | None,
        tail: deque[str] | None,
        line: ConsoleLine | None = None,
        on_log_error: Callable[[OSError], None] | None = None,
    ) -> None:
        self.fd = fd
        self._on_log_error = on_log_error
        self._prefix = prefix
        self._console = console
        self._log = log
        self._tail = tail
        self._partial = b""
        self._line = line or ConsoleLine()
        self._open = False  # our console line has text and no end yet
        self._cut = False  # another stream's line ended ours on the console: that end was shown
        self._redrawing = False  # the current line has had a \\r: show its text as it comes
        self._pending = ""  # console text of a line not ended yet (and not being redrawn)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        if self._log is not None:
            try:
                self._log.write(data)
            except OSError as exc:  # full disk, quota, I/O error: the job and the console go on
                self._drop_log(exc)
        if self._console is not None:
            self._show(self._decoder.decode(data))
        if self._tail is None:
            return
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > MAX_PARTIAL_LINE:
            lines.append(self._partial)
            self._partial = b""
        self._tail.extend(_last_redraw(line.decode(errors="replace")) for line in lines)

    def finish(self) -> None:
        """EOF: a last line without a newline is still a line."""
        if self._console is not None:
            self._show(self._decoder.decode(b"", final=True))
            rest = self._pending.rstrip("\r")
            self._pending = ""
            if rest or self._open:
                self._write("".join(self._text(rest)) + "\n", still_open=False)
        if self._partial and self._tail is not None:
            self._tail.append(_last_redraw(self._partial.decode(errors="replace")))
        self._partial = b""
        if self._log is not None:
            try:
                self._log.close()
            except OSError as exc:
                self._drop_log(exc)
            self._log = None

    def _drop_log(self, exc: OSError) -> None:
        log, self._log = self._log, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()
        if self._on_log_error is not None:
            self._on_log_error(exc)

    def _text(self, segment: str) -> list[str]:
        """``segment`` continuing our line: the prefix first when the line is new."""
        return [segment] if self._open else [self._prefix, segment]

    def _show(self, text: str) -> None:
        text, self._pending = self._pending + text, ""
        held = ""
        if text.endswith("\r"):  # maybe half of \r\n: decide with the next chunk
            text, held = text[:-1], "\r"
        parts = _LINE_ENDS.split(text)
        out: list[str] = []
        for segment, end in zip(parts[:-2:2], parts[1::2], strict=True):
            if end == "\r":  # a redraw: back to the line's start, the next text brings the prefix
                if segment or self._open:
                    out += [*self._text(segment), "\r"]
                self._redrawing = True
            else:
                if segment or self._open or not self._cut:  # else: the end of a line already ended
                    out += [*self._text(segment), "\n"]
                self._redrawing = False
            self._open = self._cut = False
        last = parts[-1]
        if last and (self._redrawing or held):
            out += self._text(last)
            self._open, self._cut = True, False
        elif len(last) > MAX_PARTIAL_LINE:
            out += [*self._text(last), "\n"]
        else:
            self._pending = last
        self._pending += held
        if out:
            self._write("".join(out), still_open=self._open)

    def _write(self, text: str, still_open: bool) -> None:
        owner = self._line.owner
        if owner is not None and owner is not self and owner._open:  # end the other rank's line first
            owner._open, owner._cut = False, True
            text = "\n" + text
        self._line.owner = self if still_open else None
        if self._console is None:
            return
        try:
            self._console.write(text)
            self._console.flush()
        except (OSError, ValueError):  # console gone (closed pipe): keep supervising
            self._console = None


_LINE_ENDS = re.compile("(\r\n|\n|\r)")


def _last_redraw(line: str) -> str:
    """A line redrawn with ``\\r`` (a progress bar) as the terminal shows it: its last drawing."""
    return next((part for part in reversed(line.split("\r")) if part), "")


def shown_streams(
    rank: int, local_rank: int, console_ranks: frozenset[int] | None, hidden: frozenset[tuple[int, str]]
) -> dict[str, bool]:
    """Which of a rank's streams reach the console: its rank is shown (``--local-ranks-filter``; None
    = every rank) and the stream is not kept off it (``--redirects``: (local rank or -1 = all, stream))."""
    shown = console_ranks is None or rank in console_ranks
    return {name: shown and not {(local_rank, name), (-1, name)} & hidden for name in ("stdout", "stderr")}


def console_key(stream: TextIO | None, name: str) -> tuple[int, int] | str:
    """Which console line a stream shown on ``stream`` shares: the file it writes to (the launcher's
    stdout and stderr on one terminal, or one pipe with ``2>&1``, share one open line, so a rank's
    stdout line never lands inside another's progress bar on stderr); ``name`` when it has none."""
    fd = console_fd(stream)
    try:
        st = os.fstat(fd) if fd is not None else None
    except OSError:
        st = None
    return (st.st_dev, st.st_ino) if st is not None else name


def console_prefix(template: str, rank: RankPlan, attempt: int) -> str:
    """A rank's console prefix (``--prefix``; keys: rank, local_rank, node, attempt)."""
    return template.format(rank=rank.rank, local_rank=rank.local_rank, node=rank.node, attempt=attempt)
