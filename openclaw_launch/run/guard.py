"""The guardian: cleans up after a launcher that was SIGKILLed.

Workers die with the launcher through PR_SET_PDEATHSIG, but their grandchildren,
the MPS daemon and temporary directories do not. The guardian is a forked copy
of the launcher (a fork costs about a millisecond; a fresh interpreter ~80 ms of
CPU on a small box) in its own session, so a signal to the launcher's process
group does not reach it. The launcher tells it over a pipe, one JSON object per
line, what to clean. When the pipe reaches EOF without a ``done`` message the
launcher is dead: the guardian runs the registered commands, kills the
registered job cgroups (cgroup.py: a worker's setsid'd grandchild too) and
process groups, removes the cgroups and the registered paths, and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from openclaw_launch.config.defaults import HANDLED_SIGNALS
from openclaw_launch.config.signals import signal_numbers
from openclaw_launch.single_thread import assert_single_threaded

DEFAULT_COMMAND_TIMEOUT_S = 10.0
DEFAULT_CLOSE_TIMEOUT_S = 5.0


class Guardian:
    """Launcher side of the guardian. Messages are best-effort: a dead guardian is not an error."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._fd: int | None = write_fd
        self._next_command_id = 0
        self._reaped = False
        self.lost: str | None = None  # why the guardian can no longer clean up after us, once it cannot

    def died(self, status: int) -> None:
        """The supervisor reaped the guardian (it collects every child): it can do nothing more."""
        code = os.waitstatus_to_exitcode(status)
        how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if self.lost is None:
            self.lost = f"guardian pid {self.pid} {how}"
        self._close_fd()
        self._reaped = True

    @classmethod
    def start(cls) -> Guardian:
        """Fork the guardian. Call from a single-threaded process, before spawning workers."""
        assert_single_threaded("fork the guardian")
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never returns into the caller's stack
            code = 1
            try:
                os.close(write_fd)
                _detach(read_fd)
                _guard(read_fd)
                code = 0
            finally:
                os._exit(code)
        os.close(read_fd)
        return cls(pid, write_fd)

    def _send(self, message: Mapping[str, Any]) -> None:
        if self._fd is None:
            return
        data = memoryview((json.dumps(message) + "\n").encode())
        try:
            while data:  # a message over PIPE_BUF (a command's environment) may be written in parts
                data = data[os.write(self._fd, data) :]
        except OSError as e:  # guardian gone: nothing more it can do for us (the report says so)
            if self.lost is None:
                self.lost = f"a message to guardian pid {self.pid} failed: {e.strerror or e}"
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def watch_pgid(self, pgid: int) -> None:
        self._send({"op": "watch_pgid", "pgid": pgid})

    def unwatch_pgid(self, pgid: int) -> None:
        """Forget a group once it is gone, so a recycled pgid is never killed."""
        self._send({"op": "unwatch_pgid", "pgid": pgid})

    def watch_path(self, path: str) -> None:
        self._send({"op": "watch_path", "path": path})

    def watch_cgroup(self, path: str) -> None:
        """The job cgroup: ``cgroup.kill`` then rmdir if the launcher dies."""
        self._send({"op": "watch_cgroup", "path": path})

    def watch_command(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
    ) -> int:
        """Run ``argv`` (env on top of the guardian's environment, ``stdin`` as its input) if the
        launcher dies. Returns an id for ``unwatch_command``."""
        self._next_command_id += 1
        self._send(
            {
                "op": "watch_command",
                "id": self._next_command_id,
                "argv": list(argv),
                "env": dict(env or {}),
                "stdin": stdin,
                "timeout_s": timeout_s,
            }
        )
        return self._next_command_id

    def unwatch_command(self, command_id: int) -> None:
        self._send({"op": "unwatch_command", "id": command_id})

    def close(self, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """The launcher is ending cleanly: the guardian exits doing nothing.

        It exits at once on ``done``; the wait is bounded all the same (a stopped guardian, or one
        whose pipe broke and that is now running its cleanup) and it is SIGKILLed after ``timeout_s``.
        """
        self._send({"op": "done"})
        self._close_fd()
        if self._reaped:
            return
        try:
            if not _exited_within(self.pid, timeout_s):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)  # SIGKILL: prompt
                return
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # already reaped by the supervisor's waitpid(-1)
            pass


def _exited_within(pid: int, timeout_s: float) -> bool:
    """Whether our child ``pid`` exits (or has exited) within ``timeout_s``: a pidfd says so the
    moment it happens (the clean exit waits for nothing else); without pidfds (Linux < 5.3), polled."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # reaped already (the supervisor's waitpid(-1))
        return True
    except OSError:
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while os.waitpid(pid, os.WNOHANG)[0] == 0:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return True
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def _detach(keep_fd: int) -> None:
    """Own session, no inherited fds (a held pipe would keep a reader waiting for EOF), default signals."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in signal_numbers(HANDLED_SIGNALS):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, keep_fd)
    os.closerange(keep_fd + 1, os.sysconf("SC_OPEN_MAX"))


def _guard(fd: int) -> None:
    """Read instructions until EOF; clean up unless the launcher said ``done``."""
    pgids: dict[int, None] = {}
    paths: dict[str, None] = {}
    commands: dict[int, dict[str, Any]] = {}
    cgroups: dict[str, None] = {}
    buffer = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            msg = json.loads(line)
            op = msg["op"]
            if op == "done":
                return
            if op == "watch_pgid":
                pgids[msg["pgid"]] = None
            elif op == "unwatch_pgid":
                pgids.pop(msg["pgid"], None)
            elif op == "watch_path":
                paths[msg["path"]] = None
            elif op == "watch_cgroup":
                cgroups[msg["path"]] = None
            elif op == "watch_command":
                commands[msg["id"]] = msg
            elif op == "unwatch_command":
                commands.pop(msg["id"], None)
    _cleanup(commands.values(), pgids, paths, cgroups)


def _cleanup(
    commands: Iterable[dict[str, Any]], pgids: Iterable[int], paths: Iterable[str], cgroups: Iterable[str] = ()
) -> None:
    """Commands first (they may need the processes, e.g. MPS quit), then cgroups and groups, then paths."""
    import shutil
    import subprocess

    from openclaw_launch.run.cgroup import JobCgroup

    for cmd in commands:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                cmd["argv"],
                input=(cmd["stdin"] or "").encode(),
                env={**os.environ, **cmd["env"]},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=cmd["timeout_s"],
                check=False,
            )
    jobs = [JobCgroup(path) for path in cgroups]
    for job in jobs:
        job.kill()
    for pgid in pgids:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    for job in jobs:
        job.remove()  # waits (bounded) for it to empty
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
