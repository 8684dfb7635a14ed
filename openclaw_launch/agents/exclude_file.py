"""The exclude file: the nodes to leave out of the next allocation, as the one line of a Slurm
hostlist that ``sbatch --exclude="$(cat FILE)"`` takes (``node[01-03,07]``; agents/hostlist.py's
``compress_hostlist``), and beside it ``FILE.reasons``, one line per node the job took out: why.

``preflight --exclude-file`` writes the whole list (``write_exclude_file``: a stale list must not stay
behind); an elastic job's ``run --exclude-file`` adds each node it takes out (``append_exclusion``), to
what the file holds already (an earlier job's or preflight's list stays). Every write is atomic
(files.write_atomic: a reader sees the old line or the new one), and appends are serialised by a lock
on the file's directory (several launchers on one shared directory). ``check_exclude_file`` runs
before the job starts: an unwritable path or a file that is no hostlist is refused then (exit 2), not
when the first node is taken out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from openclaw_launch.agents.hostlist import compress_hostlist, parse_hostlist
from openclaw_launch.errors import OpenclawError
from openclaw_launch.files import check_output_path, write_atomic
from openclaw_launch.report.membership import Exclusion
from openclaw_launch.safe_read import InputFileError, read_input

REASONS_SUFFIX = ".reasons"  # FILE.reasons: one line per node taken out, with its reason
MAX_EXCLUDE_FILE_BYTES = 1 << 20  # a hostlist of every node of a large cluster fits many times


class ExcludeFileError(OpenclawError):
    pass


def reasons_path(path: str | os.PathLike[str]) -> str | None:
    """Where the reasons go: ``FILE.reasons``; None for a device (``/dev/null``: nothing beside it)."""
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        return None
    return os.fspath(path) + REASONS_SUFFIX


def check_exclude_file(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be the exclude file, or None: checked before the job starts."""
    for where in (os.fspath(path), reasons_path(path)):
        problem = check_output_path(where) if where else None
        if problem is not None:
            return problem
    try:
        read_exclude_file(path)
    except ExcludeFileError as e:
        return str(e)
    return None


def read_exclude_file(path: str | os.PathLike[str]) -> list[str]:
    """The hosts the file names (none when it is missing, empty or a device)."""
    target = Path(os.path.realpath(path))
    if not target.exists() or not stat.S_ISREG(target.stat().st_mode):
        return []
    try:
        text = read_input(target, "exclude file", MAX_EXCLUDE_FILE_BYTES)
    except InputFileError as e:
        raise ExcludeFileError(str(e)) from None
    try:
        return parse_hostlist(",".join(text.split()))
    except OpenclawError as e:
        raise ExcludeFileError(
            f"{path} holds no Slurm hostlist ({e}); remove it or name another file (it is read to add to it)"
        ) from None


def write_exclude_file(path: str | os.PathLike[str], hosts: Sequence[str]) -> str:
    """Replace the file with ``hosts`` as one hostlist line (empty when none); the line."""
    line = compress_hostlist(hosts)
    write_atomic(path, line + "\n")
    return line


def append_exclusion(path: str | os.PathLike[str], exclusion: Exclusion) -> str:
    """Add ``exclusion.host`` to the file's hostlist (the hosts there stay) and its reason to
    ``FILE.reasons``; the file's new line. ``OSError`` or ``ExcludeFileError`` when it cannot."""
    with _locked(path):
        line = write_exclude_file(path, [*read_exclude_file(path), exclusion.host])
        where = reasons_path(path)
        if where is not None:
            try:
                before = read_input(where, "exclude file's reasons", MAX_EXCLUDE_FILE_BYTES)
            except InputFileError:
                before = ""  # none yet (or unreadable: the file's line is what Slurm reads)
            write_atomic(where, before + reason_line(exclusion) + "\n")
    return line


def reason_line(exclusion: Exclusion) -> str:
    """One line of ``FILE.reasons``: the host, when (UTC), why."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(exclusion.time_s))
    return f"{exclusion.host}\t{when}\t{exclusion.line}"


@contextlib.contextmanager
def _locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive lock on the file's directory (the file itself is replaced by each write)."""
    directory = Path(os.path.realpath(path)).parent
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
