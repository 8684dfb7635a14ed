"""Writing files that others read while we run (reports, snapshots, configs)."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

_CHECK_BYTES = 64 << 10  # what the check before a job writes (and removes): a full disk refuses it


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _resolve(path: str | os.PathLike[str]) -> Path:
    """Where a write to ``path`` lands: a symlink's target (the link stays a link)."""
    return Path(os.path.realpath(path))


def check_output_path(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot receive an output file, or None: checked before a job starts, so a long
    job does not end with "cannot write the report". A device (``/dev/null``) is written through;
    a directory, a path under a file or /proc, a read-only or missing directory are refused."""
    target = _resolve(path)
    if target.is_dir():
        return f"{path} is a directory"
    if target.exists() and not target.is_file():
        return None if stat.S_ISCHR(target.stat().st_mode) else f"{path} is not a regular file or a device"
    if target.is_relative_to("/proc") or target.is_relative_to("/sys"):
        return f"{path} is under /{target.parts[1]}, not a place for files"
    parent = target.parent
    while not parent.exists():  # made at the end, as write_atomic does
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:  # a read-only filesystem, permissions, no inodes: try it
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.check.", dir=parent)
    except OSError as e:
        return f"cannot create files in {parent}: {e.strerror or e}"
    try:  # a full disk creates the (empty) file and refuses its bytes: write some, as the report will
        os.write(fd, b"\0" * _CHECK_BYTES)  # no fsync: the filesystem refuses the blocks at the write
    except OSError as e:
        return f"cannot write {_CHECK_BYTES >> 10} KiB in {parent}: {e.strerror or e}"
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return None


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Temp file in the same directory + fsync + rename: a reader sees the old file or the whole new
    one, never half of it, also after a crash, and a failed write leaves no temp file behind. The
    file gets the usual mode (0666 less the umask). Missing parent directories are made
    (``--report logs/$SLURM_JOB_ID/report.json`` must not fail at the end of a long job).

    A symlink is written through (its target is replaced, the link stays); a device such as
    /dev/null is written to, never replaced."""
    target = _resolve(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        if not stat.S_ISCHR(target.stat().st_mode):  # a FIFO would block until someone reads
            raise OSError(errno.EINVAL, "not a regular file or a device", str(path))
        with open(target, "w") as f:  # a device: write to it, never replace it
            f.write(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # the rename itself survives a crash once the directory is synced
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
