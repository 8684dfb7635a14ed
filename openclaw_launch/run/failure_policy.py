"""The failure policy, a supervision participant (run/participant.py): each attempt's first stop
classified (run/failure_class.py) with the evidence the launcher has then, and the restart-storm
rule.

Restart storm: when the same rank fails with the same class before its first step in two attempts
in a row, another restart would fail the same way; this participant then gives the attempt a second
stop reason (``StopKind.STORM``, never restartable), so the one restart decision (supervise.py's
wish, and on several nodes the agents' vote, where a storm is an end outcome that vetoes the
restart on every node) ends the job instead of using up ``--max-restarts``. Steps come from the
statistics session (no statistics, e.g. ``--telemetry off``: the rule never fires). A failure whose
class a restart cannot help still restarts per ``--max-restarts`` otherwise, as under torchrun.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from openclaw_launch.exit_codes import class_exit_code
from openclaw_launch.run.failure_class import Evidence, Failure, GpuEvent, classify
from openclaw_launch.run.participant import Participant, StopKind, StopReason

_CLASSIFIED = (StopKind.FAILURE, StopKind.HANG, StopKind.LOST, StopKind.REMOTE)  # a signal is no failure


class FailurePolicy(Participant):
    def __init__(
        self,
        gpus: Mapping[int, str | None],
        max_restarts: int,
        say: Callable[[str], None],
        steps_of: Callable[[int], int | None] | None = None,
        oom_kills: Callable[[], int | None] | None = None,
        gpu_events: Callable[[], Sequence[GpuEvent]] | None = None,
    ) -> None:
        """``gpus``: each local rank's GPU UUID; ``steps_of(rank)``: steps the rank made in this
        attempt (None: unknown); ``oom_kills()``: the job cgroup's OOM-kill count (None: unknown);
        ``gpu_events()``: every NVML event seen so far in the job, oldest first."""
        self.gpus = gpus
        self.max_restarts = max_restarts
        self.say = say
        self.steps_of = steps_of
        self.oom_kills = oom_kills or (lambda: None)
        self.gpu_events = gpu_events or (lambda: ())
        self.failures: dict[int, Failure] = {}  # per attempt: its first stop, classified
        self.attempt = 0
        self._oom_base = 0
        self._events_seen = 0
        self._before_step: dict[int, tuple[str, int]] = {}  # per attempt: (class, rank) of a failure before any step
        self._storm: StopReason | None = None

    def begin_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self._storm = None
        self._oom_base = self.oom_kills() or 0
        self._events_seen = len(self.gpu_events())

    def on_stop(self, reason: StopReason) -> None:
        if self.attempt in self.failures or reason.kind not in _CLASSIFIED:
            return
        evidence = reason.evidence or Evidence(stop=reason.kind.value)
        if reason.kind is StopKind.FAILURE:
            gpu = self.gpus.get(reason.rank) if reason.rank is not None else None
            events = tuple(e for e in self.gpu_events()[self._events_seen :] if gpu and e.uuid == gpu)
            oom = max((self.oom_kills() or 0) - self._oom_base, 0)
            evidence = dataclasses.replace(evidence, oom_kills=oom, gpu_events=events)
        failure = classify(evidence, reason.rank, reason.node)
        self.failures[self.attempt] = failure
        self._judge_storm(reason, failure)

    def _judge_storm(self, reason: StopReason, failure: Failure) -> None:
        rank = reason.rank
        if reason.kind is not StopKind.FAILURE or rank is None or self.steps_of is None:
            return
        if self.steps_of(rank) != 0:
            return
        self._before_step[self.attempt] = (failure.name, rank)
        if self._before_step.get(self.attempt - 1) != (failure.name, rank) or self.attempt >= self.max_restarts:
            return  # not twice in a row, or no restart left to save
        left = self.max_restarts - self.attempt
        text = (
            f"restart storm: rank {rank} on node {reason.node} failed the same way twice in a row before its "
            f"first step ({failure.name}: {failure.detail}; attempts {self.attempt} and {self.attempt + 1}): "
            f"stopping the job instead of restarting it ({left} of --max-restarts {self.max_restarts} unused). "
            "Fix what fails at start-up; docs/failures.md"
        )
        self.failures[self.attempt] = dataclasses.replace(failure, storm=True)
        self._storm = StopReason(StopKind.STORM, reason.exit_code, text, False, reason.node, rank)
        self.say(f"openclaw-launch: {text}")

    def stop_reason(self) -> StopReason | None:
        return self._storm

    def exit_code(self, code: int, attempts: int, signal_received: int | None) -> int:
        """``--exit-code-classes``: a failed job's code from its last attempt's class (70: do not
        requeue, 75: requeue; exit_codes.py); success and a signal to the launcher keep theirs."""
        failure = self.failures.get(attempts - 1)
        if code == 0 or signal_received is not None or failure is None:
            return code
        return class_exit_code(failure.restart_helps)
