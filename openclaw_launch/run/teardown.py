"""Stopping an attempt's workers: signal their process groups, SIGKILL after the grace period, give
up after the kill timeout, then kill and reap whatever of ours is left (never an exempt process,
never a group id the kernel may have handed to a stranger).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence

from openclaw_launch.run.event_loop import EventLoop
from openclaw_launch.run.osproc import OsLayer
from openclaw_launch.run.worker_record import WorkerRecord


class Teardown:
    def __init__(
        self,
        os_layer: OsLayer,
        loop: EventLoop,
        grace_period_s: float,
        kill_timeout_s: float,
        exempt: Callable[[], set[int]],
    ) -> None:
        self.os = os_layer
        self.loop = loop
        self.grace_period_s = grace_period_s
        self.kill_timeout_s = kill_timeout_s
        self._exempt = exempt  # never killed as leftovers (the guardian, the MPS daemon), with their children
        self.unkillable: list[int] = []  # pids still alive kill_timeout_s after SIGKILL, for the whole job
        self.workers: Sequence[WorkerRecord] = ()
        self.live: Mapping[int, WorkerRecord] = {}
        self.killed = False
        self.gave_up = False

    def begin(self, workers: Sequence[WorkerRecord], live: Mapping[int, WorkerRecord]) -> None:
        """A new attempt: its records (the supervisor's own list and pid map, updated as it goes)."""
        self.workers, self.live = workers, live
        self.killed = self.gave_up = False

    def exempt(self) -> set[int]:
        return set(self.unkillable) | self._exempt()

    def stop(self, sig: int) -> None:
        """Forward ``sig`` to every group, SIGKILL after the grace period."""
        self.signal_groups(sig)
        self.loop.at(self.grace_period_s, self.kill_groups)

    def signal_groups(self, sig: int) -> None:
        """Every worker's group that is still ours. A live (or unreaped) worker holds its group id;
        once it is reaped, the group is signalled only while one of our descendants is in it (its
        children may still run there)."""
        ours: set[int] | None = None
        for w in self.workers:
            if w.pid is None:
                continue
            if w.pid not in self.live:
                if ours is None:
                    ours = self.os.descendant_groups(self.exempt())
                if w.pid not in ours:
                    continue
            self.os.killpg(w.pid, sig)

    def kill_groups(self) -> None:
        if self.killed:
            return
        self.killed = True
        self.signal_groups(signal.SIGKILL)
        self.loop.at(self.kill_timeout_s, self._give_up)

    def _give_up(self) -> None:
        self.gave_up = True

    def kill_leftovers(self, step: Callable[[float], None], poll_s: float) -> None:
        """SIGKILL what is left of the groups, then any descendant not exempt, and reap them (bounded:
        ``step`` runs the event loop, which reaps)."""
        if self.gave_up:
            self.unkillable.extend(self.live)
        self.signal_groups(signal.SIGKILL)
        exempt = self.exempt()
        deadline = self.os.monotonic() + self.kill_timeout_s
        while True:
            left = self.os.descendants(exempt)
            if not left:
                break
            if self.os.monotonic() >= deadline:
                self.unkillable.extend(left)
                break
            for pid in left:
                self.os.kill(pid, signal.SIGKILL)
            step(poll_s)
