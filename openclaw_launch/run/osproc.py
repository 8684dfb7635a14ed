"""Every OS call the supervisor makes, behind one object.

The supervisor's state machine only talks to an ``OsLayer``; ``RealOs`` is the
Linux implementation and tests can swap in a recording fake to drive exits,
signals and the clock. Nothing here blocks except ``wait_fds``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from openclaw_launch.limits import MAX_ERROR_FILE_BYTES
from openclaw_launch.run import terminal
from openclaw_launch.run.cgroup import join as join_cgroup
from openclaw_launch.run.prewarm import Zygote, ZygoteUnusable
from openclaw_launch.run.terminal import Terminal
from openclaw_launch.safe_read import read_untrusted
from openclaw_launch.single_thread import assert_single_threaded

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

_READ_CHUNK = 65536


@dataclass(frozen=True)
class Spawned:
    """A started worker: its pid (= its process group and session id) and the read ends of its
    pipes (a pty's master side for a stream that got a terminal, run/terminal.py)."""

    pid: int
    stdout_fd: int | None
    stderr_fd: int | None


@dataclass(frozen=True)
class Reaped:
    """One child collected by ``wait4``, with its resource usage."""

    pid: int
    status: int  # raw wait status
    cpu_s: float
    max_rss_kib: int


class OsLayer(Protocol):
    def pid(self) -> int: ...
    def monotonic(self) -> float: ...
    def time(self) -> float: ...
    def set_child_subreaper(self, on: bool) -> bool: ...
    def install_signals(self, signals: Iterable[int]) -> int: ...
    def restore_signals(self) -> None: ...
    def drain_signals(self) -> list[int]: ...
    def watch_fd(self, fd: int) -> None: ...
    def unwatch_fd(self, fd: int) -> None: ...
    def wait_fds(self, timeout: float | None) -> list[int]: ...
    def read_fd(self, fd: int) -> bytes | None: ...
    def close_fd(self, fd: int) -> None: ...
    def spawn(self, argv: Sequence[str], env: Mapping[str, str], tty: Terminal | None = None) -> Spawned: ...
    def resize_terminals(self, size_fd: int) -> None: ...
    def killpg(self, pgid: int, sig: int) -> bool: ...
    def kill(self, pid: int, sig: int) -> bool: ...
    def reap(self) -> list[Reaped]: ...
    def proc_status(self, pid: int) -> dict[str, str] | None: ...
    def proc_comm(self, pid: int) -> str | None: ...
    def descendants(self, exempt: Collection[int] = ()) -> list[int]: ...
    def descendant_groups(self, exempt: Collection[int] = ()) -> set[int]: ...
    def open_log(self, path: str) -> BinaryIO: ...
    def read_text(self, path: str) -> str | None: ...
    def read_error_file(self, path: str) -> str | None: ...
    def fresh_file(self, path: str) -> None: ...


def reset_signal_state() -> None:
    """Undo what a parent may leave behind (schedulers, ``subprocess`` callers): a blocked signal
    never wakes the supervisor (a blocked SIGCHLD: a worker's exit is never seen) and the workers
    inherit the mask; an ignored SIGCHLD makes the kernel reap the workers before we can."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _noop_handler(signum: int, frame: object) -> None:
    """Python-level handler whose only job is to make the C handler write to the wakeup fd."""


class RealOs:
    """Linux implementation. Single-threaded use only (signal handlers, preexec)."""

    def __init__(self) -> None:
        import ctypes  # lazily: only a launcher that spawns needs prctl

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._pid = os.getpid()
        self._selector = selectors.DefaultSelector()
        self._popens: dict[int, subprocess.Popen[bytes]] = {}
        self._ptys: dict[int, int] = {}  # the workers' pty masters now open -> their margin (columns)
        self._old_handlers: dict[int, object] = {}
        self._old_wakeup: int | None = None
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._installs = 0
        self.cgroup_procs: str | None = None  # the job cgroup's cgroup.procs: workers join it (cgroup.py)
        self.zygote: Zygote | None = None  # --prewarm: workers are forked by it (run/prewarm.py)

    def pid(self) -> int:
        return self._pid

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def set_child_subreaper(self, on: bool) -> bool:
        """Orphaned grandchildren reparent to us so they can be killed and reaped. Returns the old value."""
        import ctypes

        old = ctypes.c_int(0)
        self._libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(old), 0, 0, 0)
        if self._libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")
        return bool(old.value)

    def install_signals(self, signals: Iterable[int]) -> int:
        """Route the given signals to a non-blocking pipe (read it with ``drain_signals``).

        Nests: ``launch`` installs the forwarded signals for its whole run (MPS start and stop
        included) and ``supervise`` adds SIGCHLD; a signal caught by the outer installation stays
        in the pipe for the inner one. Handlers go back only at the outermost ``restore_signals``.
        """
        if self._wake_r is None:
            reset_signal_state()
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
            self.watch_fd(self._wake_r)
        for sig in signals:
            if sig in self._old_handlers:
                continue
            if sig != signal.SIGCHLD and signal.getsignal(sig) == signal.SIG_IGN:
                continue  # ignored by whoever started us (nohup: SIGHUP): honour it, forward nothing
            self._old_handlers[sig] = signal.signal(sig, _noop_handler)
        self._installs += 1
        return self._wake_r

    def restore_signals(self) -> None:
        self._installs = max(self._installs - 1, 0)
        if self._installs:
            return
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._old_handlers.clear()
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            self._old_wakeup = None
        if self._wake_r is not None and self._wake_w is not None:
            self.unwatch_fd(self._wake_r)
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._wake_r = self._wake_w = None

    def drain_signals(self) -> list[int]:
        sigs: list[int] = []
        while self._wake_r is not None:
            try:
                data = os.read(self._wake_r, 512)
            except BlockingIOError:
                break
            if not data:
                break
            sigs.extend(data)
        return sigs

    def watch_fd(self, fd: int) -> None:
        self._selector.register(fd, selectors.EVENT_READ)

    def unwatch_fd(self, fd: int) -> None:
        with contextlib.suppress(KeyError):
            self._selector.unregister(fd)

    def wait_fds(self, timeout: float | None) -> list[int]:
        if timeout is not None:
            timeout = max(timeout, 0.0)
        return [key.fd for key, _ in self._selector.select(timeout)]

    def read_fd(self, fd: int) -> bytes | None:
        """Bytes read, ``b""`` at EOF, None when nothing is there now."""
        if fd in self._ptys:
            return terminal.read_master(fd, _READ_CHUNK)
        try:
            return os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return None

    def close_fd(self, fd: int) -> None:
        self._ptys.pop(fd, None)
        os.close(fd)

    def resize_terminals(self, size_fd: int) -> None:
        """Every worker's pty takes the window size the launcher's terminal has now (SIGWINCH)."""
        for fd, margin_columns in self._ptys.items():
            size = terminal.window_size(size_fd, margin_columns)
            if size is not None:
                terminal.set_window_size(fd, size)

    def _child_setup(self) -> None:
        """Runs in the child before exec: die with the launcher, and not be born an orphan."""
        if self._libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != self._pid:  # launcher died between fork and prctl
            os._exit(126)
        if self.cgroup_procs is not None:  # before exec: nothing the worker starts is outside
            join_cgroup(self.cgroup_procs)

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], tty: Terminal | None = None) -> Spawned:
        """Start argv in its own session with ``env`` on top of this process's environment; its
        stdout and stderr are pipes, or ptys where ``tty`` says so (a pipe where no pty can be had)."""
        assert_single_threaded(f"spawn the worker {argv[0]} (with a preexec_fn)")
        size = terminal.window_size(tty.size_fd, tty.margin_columns) if tty is not None else None
        ends: list[tuple[int, int]] = []  # (ours, the worker's) for stdout, stderr
        ptys: list[int] = []
        try:
            for wanted in (tty is not None and tty.stdout, tty is not None and tty.stderr):
                pair = terminal.open_pty(size) if wanted else None
                ptys += [pair[0]] if pair is not None else []
                ends.append(pair or os.pipe())
            full_env = {**os.environ, **env, **(terminal.size_env(size, {**os.environ, **env}) if ptys else {})}
            pid = self._prewarmed(argv, full_env, ends[0][1], ends[1][1])
            if pid is None:
                proc = subprocess.Popen(
                    list(argv),
                    env=full_env,
                    stdout=ends[0][1],
                    stderr=ends[1][1],
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=self._child_setup,
                )
                self._popens[proc.pid] = proc
                pid = proc.pid
        except BaseException:
            for ours, _ in ends:
                os.close(ours)
            raise
        finally:
            for _, theirs in ends:
                os.close(theirs)
        (out_r, _), (err_r, _) = ends
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        self._ptys.update(dict.fromkeys(ptys, tty.margin_columns if tty is not None else 0))
        return Spawned(pid, out_r, err_r)

    def _prewarmed(self, argv: Sequence[str], env: Mapping[str, str], out_fd: int, err_fd: int) -> int | None:
        """The worker forked by the prewarm zygote (run/prewarm.py); None: spawn it directly (no
        zygote, or one that cannot serve: it said why once)."""
        if self.zygote is None or self.zygote.problem is not None:
            return None
        try:
            return self.zygote.spawn(argv, env, out_fd, err_fd, self.cgroup_procs)
        except ZygoteUnusable:
            return None

    def killpg(self, pgid: int, sig: int) -> bool:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def kill(self, pid: int, sig: int) -> bool:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def reap(self) -> list[Reaped]:
        """Collect every exited child (workers, reparented orphans, zombies when PID 1)."""
        reaped: list[Reaped] = []
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            proc = self._popens.pop(pid, None)
            if proc is not None:  # we reaped it: tell Popen so it never waits on a recycled pid
                proc.returncode = os.waitstatus_to_exitcode(status)
            if self.zygote is not None and pid == self.zygote.pid:
                self.zygote.died(status)
            reaped.append(Reaped(pid, status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
        return reaped

    def proc_status(self, pid: int) -> dict[str, str] | None:
        text = self.read_text(f"/proc/{pid}/status")
        if text is None:
            return None
        fields: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key] = value.strip()
        return fields

    def proc_comm(self, pid: int) -> str | None:
        text = self.read_text(f"/proc/{pid}/comm")
        return None if text is None else text.strip()

    def descendants(self, exempt: Collection[int] = ()) -> list[int]:
        """Live (non-zombie) descendants of this process, from one scan of /proc; ``exempt`` pids and
        everything under them (the MPS control daemon and its servers) are left out."""
        return list(self._descendants(exempt))

    def descendant_groups(self, exempt: Collection[int] = ()) -> set[int]:
        """Process groups that hold at least one live descendant of ours: the groups still ours to
        signal after their leader was reaped."""
        return set(self._descendants(exempt).values())

    def _descendants(self, exempt: Collection[int]) -> dict[int, int]:
        """pid -> process group of every live descendant."""
        children: dict[int, list[int]] = {}
        groups: dict[int, int] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            stat = self.read_text(f"/proc/{name}/stat")
            if stat is None:
                continue
            fields = stat.rpartition(")")[2].split()
            if len(fields) < 3 or fields[0] == "Z":
                continue
            children.setdefault(int(fields[1]), []).append(int(name))
            groups[int(name)] = int(fields[2])
        found: dict[int, int] = {}
        exempt = {*exempt, self.zygote.pid} if self.zygote is not None else exempt  # it forks, never a leftover
        todo = [self._pid]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in exempt:
                    found[child] = groups[child]
                    todo.append(child)
        return found

    def open_log(self, path: str) -> BinaryIO:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "ab", buffering=0)

    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    def read_error_file(self, path: str) -> str | None:
        """A worker's ``@record`` error file, read as every file a worker controls is (safe_read.read_untrusted)."""
        return read_untrusted(path, MAX_ERROR_FILE_BYTES)

    def fresh_file(self, path: str) -> None:
        """Make ``path`` ready to be written by a worker: its directory exists (torch's ``@record``
        does not create it), an old file is gone."""
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
