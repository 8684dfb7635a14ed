"""A replica group's own account of its attempts (``--replica-groups``, job/replica_groups.py): the
steps each attempt made and, for each restart, how long after the failure the group stepped again.

A participant of the group launcher's supervision like any other (run/participant.py): it notes the
failure when the supervisor stops for it (``on_stop``), keeps each attempt's steps at its end, and
while a restarted attempt has not stepped looks at the statistics every ``_POLL_S`` for its first
step (a rank sends its first step at once, telemetry/recorder.py), so a time to step again is the
failure's detection to the first step's arrival, within ``_POLL_S``.

``gone`` (openclaw's lighthouse only, job/replica_groups.py): told when the supervisor stops an
attempt for a failure (the group's replica is as good as dead: its ranks are being stopped) and
when an attempt ends, so that the lighthouse drops the group from the next quorum at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from openclaw_launch.report.replica_groups import GroupProgress as Progress
from openclaw_launch.run.participant import Participant, StopKind, StopReason, Timer

_POLL_S = 0.05


class GroupProgress(Participant):
    def __init__(
        self,
        ranks: Sequence[int],
        clock: Callable[[], float] = time.monotonic,
        gone: Callable[[], None] | None = None,
    ) -> None:
        self._ranks = tuple(ranks)
        self._gone = gone
        self._clock = clock
        self._steps_of: Callable[[int], int] | None = None
        self._failed_at: float | None = None  # this attempt's failure, as the supervisor saw it
        self._waiting_since: float | None = None  # a restart's failure, until the group steps again
        self.steps: list[int] = []
        self.rejoin_s: list[float] = []

    def attach(self, steps_of: Callable[[int], int] | None) -> None:
        """The statistics' steps of a rank in the open attempt (None: --telemetry off, no steps)."""
        self._steps_of = steps_of

    def begin_attempt(self, attempt: int) -> None:
        self._failed_at = None

    def on_stop(self, reason: StopReason) -> None:
        if reason.kind is StopKind.FAILURE and self._failed_at is None:
            self._failed_at = self._clock()
            if self._gone is not None:
                self._gone()

    def end_attempt(self, attempt: int) -> None:
        if self._gone is not None:
            self._gone()
        self._look()  # a first step that came just before the end still counts
        self.steps.append(self._most_steps())
        self._waiting_since = self._failed_at  # stays None unless the attempt failed (and may restart)

    def timers(self) -> Sequence[Timer]:
        return ((_POLL_S, self._look),) if self._steps_of is not None else ()

    def _look(self) -> None:
        if self._waiting_since is not None and self._most_steps() > 0:
            self.rejoin_s.append(round(self._clock() - self._waiting_since, 3))
            self._waiting_since = None

    def _most_steps(self) -> int:
        return max((self._steps_of(r) for r in self._ranks), default=0) if self._steps_of is not None else 0

    def result(self) -> Progress:
        return Progress(steps=tuple(self.steps), rejoin_s=tuple(self.rejoin_s))
