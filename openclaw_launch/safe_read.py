"""Reading files we do not control without hanging or exhausting memory.

``open`` of a FIFO blocks until a writer comes; reading ``/dev/zero`` never ends; a 10 GB file is
read whole; deep JSON is a RecursionError. Here a file is opened non-blocking, must be a regular
file (after symlinks), at most ``limit`` bytes are read, and JSON that nests too deeply is a
ValueError like any other malformed JSON. A file a worker controls (read_untrusted) is held to more:
no symlink is followed, and a bad one is absent, never an error.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable
from typing import Any

from openclaw_launch.errors import OpenclawError


class InputFileError(OpenclawError):
    """An input file cannot be used: missing, not a regular file, too large, not text."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_prefix(path: str | os.PathLike[str], limit: int, follow_symlinks: bool = True) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the regular file ``path`` and whether there was more.

    Never blocks: the open is non-blocking (a FIFO opens at once) and anything but a regular file is
    refused with ``OSError`` before a byte is read; without ``follow_symlinks`` a symlink is refused too.
    """
    nofollow = 0 if follow_symlinks else os.O_NOFOLLOW
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | nofollow)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise IsADirectoryError(0, f"{_kind(st.st_mode)}, not a regular file", os.fspath(path))
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def read_input(path: str | os.PathLike[str], what: str, limit: int) -> str:
    """The whole text of an input file (config, snapshot, saved command output, report).

    Raises ``InputFileError`` naming ``what`` and the reason: missing, unreadable, not a regular file
    (FIFO, device, directory), over ``limit`` bytes, or not UTF-8.
    """
    where = os.fspath(path)
    try:
        data, more = read_prefix(path, limit)
    except OSError as e:
        reason = e.strerror or str(e)
        raise InputFileError(f"{where}: cannot read the {what}: {reason}") from None
    if more:
        raise InputFileError(
            f"{where}: the {what} is larger than {limit / (1 << 20):g} MiB; this is not a {what} (give the right file)"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{where}: the {what} is not UTF-8 text ({e})") from None


def read_untrusted(
    path: str | os.PathLike[str], max_bytes: int, warn: Callable[[str], None] | None = None
) -> str | None:
    """The text of a file a worker controls (its stack file, its ``@record`` error file), or None.

    Such a file can be swapped for a FIFO (a blocking open wedges the launcher), a symlink, a device
    or a huge file, or hold bytes that are not UTF-8; none of these may block or crash the
    supervisor. So: no symlink is followed, only a regular file is read, at most ``max_bytes`` of it
    (a longer one ends with a note saying it was cut), and bytes that are not UTF-8 are replaced. A
    missing file is None; any other refusal is None too, said once through ``warn``.
    """
    where = os.fspath(path)
    try:
        data, more = read_prefix(path, max_bytes, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        if warn is not None:
            warn(f"openclaw-launch: warning: {where} not read (a worker's file): {e.strerror or e}")
        return None
    text = data.decode(errors="replace")
    if more:
        text += f"\n... (cut at {max_bytes >> 10} KiB; the whole file is {where})"
    return text


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, allow_constants: bool = False) -> Any:
    """``json.loads`` for input we do not control: ValueError, not a RecursionError, when ``text``
    nests deeper than the interpreter's recursion limit (about 1000 levels; our files are a few
    deep), and unless ``allow_constants`` when it holds ``NaN``/``Infinity`` (Python's json takes
    them; JSON does not)."""
    try:
        return json.loads(text) if allow_constants else json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"it nests deeper than {sys.getrecursionlimit()} levels") from None


def read_json(path: str | os.PathLike[str], what: str, limit: int) -> Any:
    """An input file's JSON document through ``read_input`` and ``parse_json``; ``InputFileError``
    names ``what`` and the reason."""
    text = read_input(path, what, limit)
    try:
        return parse_json(text)
    except ValueError as e:
        raise InputFileError(f"{os.fspath(path)}: the {what} is not valid JSON ({e})") from None
