"""A per-job cgroup v2: every worker and everything it starts, killed in one write.

Process groups, the child subreaper and the guardian catch a worker's children while the launcher
lives, and its process groups after the launcher is SIGKILLed; a grandchild that called ``setsid``
(or was double-forked into a new session) escapes the last case. A cgroup holds it whatever it
does: the workers join ``<launcher's cgroup>/openclaw-<run_id>-<pid>/`` before they exec, their
descendants inherit it, and ``cgroup.kill`` (Linux 5.14) SIGKILLs them all at once.

Used where the host allows it: a cgroup2 hierarchy (``/sys/fs/cgroup`` on a pure-v2 host, often
``/sys/fs/cgroup/unified`` on a hybrid one) in which the launcher may create a child of its own
cgroup (root, Docker with a writable cgroupfs, a systemd ``Delegate=`` unit, Slurm's job cgroup).
With no controllers enabled for the child, cgroup v2's "no internal processes" rule does not
apply, so a child of the launcher's own cgroup is always allowed. Anywhere else ``create`` returns
None and the job runs as before (process groups + subreaper + guardian).
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from dataclasses import dataclass, field

from openclaw_launch.single_thread import assert_single_threaded

MOUNTINFO = "/proc/self/mountinfo"
PROC_CGROUP = "/proc/self/cgroup"
EMPTY_TIMEOUT_S = 5.0  # after cgroup.kill, wait this long at most for the cgroup to empty
_POLL_S = 0.01


def _unescape(field: str) -> str:
    """Mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup2_mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(root within the hierarchy, mount point) of every cgroup2 mount in a mountinfo text."""
    mounts = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) >= 5 and tail and tail[0] == "cgroup2":
            mounts.append((_unescape(fields[3]), _unescape(fields[4])))
    return mounts


def own_cgroup(proc_cgroup: str) -> str | None:
    """The unified-hierarchy path (``0::/path``) in a /proc/PID/cgroup text; None on cgroup1 only."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::/"):
            return line[3:]
    return None


def own_cgroup_dir(mountinfo: str, proc_cgroup: str) -> str | None:
    """Where this process's cgroup v2 directory is in the filesystem, or None."""
    own = own_cgroup(proc_cgroup)
    if own is None or own.endswith(" (deleted)"):
        return None
    for root, mount_point in cgroup2_mounts(mountinfo):
        rel = _relative(own, root)
        if rel is not None:
            return os.path.join(mount_point, rel) if rel else mount_point
    return None


def own_dir(mountinfo: str = MOUNTINFO, proc_cgroup: str = PROC_CGROUP) -> str | None:
    """This process's cgroup v2 directory, from the files (None: no cgroup2, cgroup1 only)."""
    info, cg = _read(mountinfo), _read(proc_cgroup)
    return own_cgroup_dir(info, cg) if info is not None and cg is not None else None


def oom_kills(directory: str) -> int | None:
    """``oom_kill`` of ``directory``'s ``memory.events``: processes of its whole subtree the OOM
    killer ended; None where the memory controller is not enabled there."""
    for line in (_read(os.path.join(directory, "memory.events")) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _relative(path: str, root: str) -> str | None:
    if root == "/":
        return path.lstrip("/")
    if path == root:
        return ""
    if path.startswith(root.rstrip("/") + "/"):
        return path[len(root.rstrip("/")) + 1 :]
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def join(procs_path: str) -> None:
    """Move the calling process into the cgroup whose ``cgroup.procs`` this is (in a worker, before
    it execs: nothing it starts can be outside). A failure leaves it where it is, silently: the
    process groups, the subreaper and the guardian still hold it."""
    with contextlib.suppress(OSError):
        _write(procs_path, b"0")


class JoinProbe:
    """A forked child that joins the cgroup and exits; its answer comes over a pipe, read when it is
    needed, not when it is made. Joining waits in the kernel (the move takes a lock that waits for an
    RCU grace period: tens of ms on a VM), so the launcher spawns its workers meanwhile. Its exit is
    collected by whoever reaps the launcher's children (the supervisor, launch's final reap), never
    by pid here: a pid reaped elsewhere may be a worker's by now."""

    def __init__(self, procs_path: str) -> None:
        assert_single_threaded("fork the cgroup probe")
        read_fd, write_fd = os.pipe()  # not inherited by the workers (O_CLOEXEC, close_fds)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            answer = b"0"
            try:
                os.close(read_fd)
                _write(procs_path, b"0")
                answer = b"1"
            finally:
                with contextlib.suppress(OSError):
                    os.write(write_fd, answer)
                os._exit(0)
        os.close(write_fd)  # now only the child holds it: its exit is EOF whatever happened
        self.pid = pid
        self._fd: int | None = read_fd
        self._joined: bool | None = None

    def joined(self, timeout_s: float = EMPTY_TIMEOUT_S) -> bool:
        """Whether the child could join (waited for, bounded, the first time): the kernel's answer
        for our credentials and this hierarchy (delegation, the common ancestor's permissions)."""
        if self._fd is not None:
            ready, _, _ = select.select([self._fd], [], [], timeout_s)
            self._joined = bool(ready) and os.read(self._fd, 1) == b"1"
            os.close(self._fd)
            self._fd = None
        return bool(self._joined)


@dataclass(frozen=True)
class JobCgroup:
    path: str  # the cgroup's directory
    probe: JoinProbe | None = field(default=None, compare=False)  # create's: whether a process can join

    def joinable(self) -> bool:
        """The probe's answer (True without one: a cgroup the guardian rebuilt from its path)."""
        return self.probe is None or self.probe.joined()

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def kill(self) -> bool:
        """SIGKILL everything in it (False: the cgroup is gone or refused)."""
        try:
            _write(os.path.join(self.path, "cgroup.kill"), b"1")
        except OSError:
            return False
        return True

    def populated(self) -> bool | None:
        """Whether a live process is in it (None: cannot tell, e.g. removed)."""
        events = _read(os.path.join(self.path, "cgroup.events"))
        if events is None:
            return None
        for line in events.splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() != "0"
        return None

    def wait_empty(self, timeout_s: float = EMPTY_TIMEOUT_S) -> bool:
        """Wait (bounded) until nothing is left in it; True when it is empty or gone."""
        deadline = time.monotonic() + timeout_s
        while self.populated():
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True

    def clear(self, timeout_s: float = EMPTY_TIMEOUT_S) -> bool:
        """Kill what is in it and wait for it to empty (the end of an attempt)."""
        if self.populated() is False:
            return True
        self.kill()
        return self.wait_empty(timeout_s)

    def remove(self, timeout_s: float = EMPTY_TIMEOUT_S) -> bool:
        """Kill, wait, rmdir (the end of the job). False when it could not be removed (a process in
        uninterruptible sleep survived the wait): the empty cgroup is then left behind."""
        self.clear(timeout_s)
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def create(
    name: str, root: str | None = None, mountinfo: str = MOUNTINFO, proc_cgroup: str = PROC_CGROUP
) -> JobCgroup | None:
    """Create ``<launcher's cgroup>/<name>`` (or ``<root>/<name>``) with ``cgroup.kill`` and start
    the probe that joins it (``JobCgroup.joinable``: read once the workers are spawned); None
    wherever no cgroup can be made (no cgroup2 mount, cgroup1 only, read-only, not permitted, a
    kernel before 5.14). A cgroup that no process may join is empty: its removal is all it costs."""
    root = root or own_dir(mountinfo, proc_cgroup)
    if root is None:
        return None
    path = os.path.join(root, name)
    try:
        os.mkdir(path)
    except OSError:
        return None
    if not os.path.exists(os.path.join(path, "cgroup.kill")):
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None
    return JobCgroup(path, JoinProbe(os.path.join(path, "cgroup.procs")))
