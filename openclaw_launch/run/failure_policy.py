"""The failure policy, a supervision participant (run/participant.py): each attempt's first stop
classified (run/failure_class.py) with the evidence the launcher has then, and the one voice that
says what is done about it: the class's words and the restart agree.

- ``--max-restarts N`` makes every attempt torchrun makes, for every class where a restart can or
  may help (a start-up failure that clears on the third try is retried).
- A class where a restart cannot help (CUDA out of memory, the host's OOM killer, a command that
  cannot start) is not restarted: this participant gives the attempt a second stop reason
  (``StopKind.CANNOT_HELP``, never restartable) and says so, with the restarts left unused. With
  ``--restart-any-class`` it is restarted as torchrun would, and the line says the flag overrode it.
- The restart storm, opt-in (``--storm-guard``): when the same rank fails with the same class before
  its first step in two attempts in a row, the job stops instead of using up ``--max-restarts``
  (``StopKind.STORM``). Steps come from the statistics session (``--telemetry off``: never fires).

Either reason takes part in the one restart decision: supervise.py's wish, and on several nodes the
agents' vote, where it is this node's end outcome, which vetoes the restart on every node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from openclaw_launch.exit_codes import class_exit_code
from openclaw_launch.run.failure_class import CANNOT_HELP, Evidence, Failure, GpuEvent, classify
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
        *,
        restart_any_class: bool = False,
        storm_guard: bool = False,
    ) -> None:
        """``gpus``: each local rank's GPU UUID; ``steps_of(rank)``: steps the rank made in this
        attempt (None: unknown); ``oom_kills()``: the job cgroup's OOM-kill count (None: unknown);
        ``gpu_events()``: every NVML event seen so far in the job, oldest first;
        ``restart_any_class``: restart a class where a restart cannot help too (torchrun's rule);
        ``storm_guard``: stop a restart storm."""
        self.gpus = gpus
        self.max_restarts = max_restarts
        self.restart_any_class = restart_any_class
        self.storm_guard = storm_guard
        self.say = say
        self.steps_of = steps_of
        self.oom_kills = oom_kills or (lambda: None)
        self.gpu_events = gpu_events or (lambda: ())
        self.failures: dict[int, Failure] = {}  # per attempt: its first stop, classified
        self.attempt = 0
        self._oom_base = 0
        self._events_seen = 0
        self._before_step: dict[int, tuple[str, int]] = {}  # per attempt: (class, rank) of a failure before any step
        self._veto: StopReason | None = None  # per attempt: no restart (a class that a restart cannot help, a storm)

    def begin_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self._veto = None
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
        if reason.kind is StopKind.FAILURE and self.attempt < self.max_restarts:  # a restart is to be decided
            self._judge_class(reason, failure)
            if self._veto is None and self.storm_guard:
                self._judge_storm(reason, failure)

    def _judge_class(self, reason: StopReason, failure: Failure) -> None:
        """A class where a restart cannot help is not restarted, unless ``--restart-any-class``; either
        way the line says which, and why."""
        if failure.restart != CANNOT_HELP:
            return
        whose = f"rank {reason.rank} on node {reason.node}"
        what = f"failure class {failure.name} ({failure.detail}): a restart cannot help"
        if self.restart_any_class:
            self.say(f"openclaw-launch: {whose}: {what}; restarting it anyway, as --restart-any-class asks")
            return
        left = self.max_restarts - self.attempt
        text = (
            f"not restarting: {whose}: {what}, another attempt fails the same way ({left} of --max-restarts "
            f"{self.max_restarts} unused; --restart-any-class restarts it anyway). docs/failures.md"
        )
        self._veto = StopReason(StopKind.CANNOT_HELP, reason.exit_code, text, False, reason.node, reason.rank)
        self.say(f"openclaw-launch: {text}")

    def _judge_storm(self, reason: StopReason, failure: Failure) -> None:
        rank = reason.rank
        if rank is None or self.steps_of is None:
            return
        if self.steps_of(rank) != 0:
            return
        self._before_step[self.attempt] = (failure.name, rank)
        if self._before_step.get(self.attempt - 1) != (failure.name, rank):
            return  # not twice in a row
        left = self.max_restarts - self.attempt
        text = (
            f"restart storm: rank {rank} on node {reason.node} failed the same way twice in a row before its "
            f"first step ({failure.name}: {failure.detail}; attempts {self.attempt} and {self.attempt + 1}): "
            f"stopping the job instead of restarting it, as --storm-guard asks ({left} of --max-restarts "
            f"{self.max_restarts} unused). Fix what fails at start-up; docs/failures.md"
        )
        self.failures[self.attempt] = dataclasses.replace(failure, storm=True)
        self._veto = StopReason(StopKind.STORM, reason.exit_code, text, False, reason.node, rank)
        self.say(f"openclaw-launch: {text}")

    def stop_reason(self) -> StopReason | None:
        return self._veto

    def exit_code(self, code: int, attempts: int, signal_received: int | None) -> int:
        """``--exit-code-classes``: a failed job's code from its last attempt's class (70: do not
        requeue, 75: requeue; exit_codes.py); success and a signal to the launcher keep theirs."""
        failure = self.failures.get(attempts - 1)
        if code == 0 or signal_received is not None or failure is None:
            return code
        return class_exit_code(failure.restart_helps)
