"""The replica groups' lighthouse (torchft's, or openclaw's: run/lighthouse_server.py), owned by the
launcher that runs the groups (job/replica_groups.py): started before the groups, stopped after the
last one, never outliving the launcher (it is spawned as a worker is: its own session, SIGKILL when
the launcher dies, run/osproc.py).

It logs its quorums (INFO lines); they go to ``DIR/RUNID/lighthouse.log`` with ``--log-dir``, and the
last lines are kept to say why, should it end while the groups need it.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from typing import BinaryIO

from openclaw_launch.plan.context import LogDir, release_port
from openclaw_launch.plan.replica_groups import LighthousePlan
from openclaw_launch.run.osproc import RealOs

_TAIL_LINES = 20
STOP_TIMEOUT_S = 5.0  # after SIGTERM, how long the lighthouse gets before SIGKILL


class Lighthouse:
    def __init__(
        self, plan: LighthousePlan, os_layer: RealOs, log_dir: str | None, run_id: str, env: dict[str, str]
    ) -> None:
        """Start it, with ``env`` beside this process's environment. The plan's port was held by this
        launcher (plan/context.py's ``free_port``): let go of it first, so that the lighthouse can bind it."""
        if plan.port is not None:
            release_port(plan.port)
        self._os = os_layer
        self._log: BinaryIO | None = None
        if log_dir:
            path = LogDir.of(log_dir, run_id).path / "lighthouse.log"
            os.makedirs(path.parent, exist_ok=True)
            self._log = open(path, "ab")  # noqa: SIM115 - closed in stop()
        self._tail: collections.deque[bytes] = collections.deque(maxlen=_TAIL_LINES)
        spawned = os_layer.spawn(plan.argv, {"RUST_BACKTRACE": "1", **env})
        self.pid = spawned.pid
        self.fds = {fd for fd in (spawned.stdout_fd, spawned.stderr_fd) if fd is not None}
        for fd in self.fds:
            os_layer.watch_fd(fd)
        self.ended: str | None = None  # how it ended, once reaped

    def read(self, fd: int) -> bool:
        """What it wrote on ``fd``: to its log, and its last lines kept. False: nothing more now."""
        data = self._os.read_fd(fd)
        if data is None:
            return False
        if not data:
            self._os.unwatch_fd(fd)
            self._os.close_fd(fd)
            self.fds.discard(fd)
            return False
        if self._log is not None:
            self._log.write(data)
        self._tail.extend(line for line in data.splitlines() if line.strip())
        return True

    def reaped(self, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        self.ended = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"

    def last_words(self) -> str:
        return "; ".join(line.decode(errors="replace").strip() for line in list(self._tail)[-3:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; reaped here unless the caller's reap was first."""
        if self.ended is None:
            self._os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while not _reaped(self.pid):
                if time.monotonic() >= deadline:
                    self._os.kill(self.pid, signal.SIGKILL)
                    _reaped(self.pid, block=True)
                    break
                time.sleep(0.01)
            self.ended = "stopped"
        for fd in list(self.fds):
            while self.read(fd):  # its last output
                pass
            if fd in self.fds:
                self._os.unwatch_fd(fd)
                self._os.close_fd(fd)
                self.fds.discard(fd)
        if self._log is not None:
            self._log.close()


def _reaped(pid: int, block: bool = False) -> bool:
    try:
        return os.waitpid(pid, 0 if block else os.WNOHANG)[0] != 0
    except ChildProcessError:  # collected already
        return True
