"""The attempt contract: the one interface every part taking part in supervision implements.

The supervisor (``run/supervise.py``) holds a list of participants (statistics session, hang
watch, node agent, MPS daemon, job cgroup, failure policy) and asks every one of them each
question, in the list's order (``Participants``); no participant's answer depends on another's or
on its place in the list. Where the answers of several must make one decision, the rule is given
with the question:

- ``begin_attempt(n)``: attempt n starts; forget everything of the previous one (a stopped
  state carried into the next attempt would stop it at once).
- ``readers()``: descriptors watched for the whole job, and what to call when one is readable.
- ``timers()``: ``(interval_s, callback)`` pairs, called while an attempt is open.
- ``stop_reason()``: None, or why this node must stop now (a ``StopReason``); asked after every
  loop step while an attempt is open, of every participant that has not given one in it (an answer
  stays the same until the next ``begin_attempt``). Every reason is kept, in the order they came
  (in one step: the list's order), and every other participant is told of it before the next one
  is asked. The first stops the workers; the exit code is the first job-wide reason's (the agents'
  fate), else the first one's; the attempt restarts only if every reason is restartable.
- ``stop_due_in_s()``: None, or in how many seconds this participant's stop reason comes due with
  no event to wake the loop (a deadline of its own: the straggler policy's grace); the loop's wait
  ends then, not at its next timer. Asked only of those without a reason in this attempt; the
  earliest counts.
- ``on_stop(reason)``: this node stops, for a reason that is not this participant's own (a
  worker failed, a signal, another participant's reason); the agent publishes it as the job's fate.
- ``holds_attempt()``: keep the attempt open after its workers are gone (the agent: until every
  node is done with it). Every one is asked; the attempt stays open while any says yes.
- ``vote_restart(attempt, wish)``: after the attempt, given this node's wish (every stop reason
  restartable and attempts left). Every one votes; the job restarts iff the wish holds and no
  participant says no.
- ``exempt_pids()``: processes never killed as leftovers (the MPS daemon): every one's, together.
- ``attempt_ranks(n, ranks)``: the ranks attempt n starts, given the plan's (an elastic job's agent
  gives its new world's, agents/elastic_agent.py). Every one is asked with the plan's ranks (never
  with another's answer); the first answer other than the plan's, in the list's order, is the
  attempt's.
- ``begin_ranks(n, ranks)``: the ranks attempt n starts, as decided, before any is spawned: what is
  kept per rank (statistics sockets, the hang watch) follows a new world's global ranks.
- ``on_spawn(rank, pid)``: the supervisor started ``pid`` as ``rank``: the only pid a participant
  may signal or believe for that rank (statistics: stats/inbox.py, hang: stats/hang_monitor.py).
- ``end_attempt(n)``: attempt n's workers and their leftovers are gone.

What a participant contributes to the report is read from it after ``supervise`` returns
(``StatsSession.finish``, ``Agent.finish``). Pre-flight (``run --preflight``) is no participant:
it runs before supervision starts (cli/run.py) and starts nothing if a tier fails.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openclaw_launch.run.failure_class import Evidence

if TYPE_CHECKING:
    from openclaw_launch.plan.model import RankPlan


class StopKind(enum.Enum):
    FAILURE = "failure"  # a worker of this node failed, or could not be started
    SIGNAL = "signal"  # this launcher received a stopping signal
    HANG = "hang"  # --hang-timeout-s fired on this node (stats/hang_monitor.py)
    LOST = "lost"  # a node of the job, or the first node's store, is gone (agents)
    REMOTE = "remote"  # another node stopped first: the job's fate (agents/fate.py)
    STORM = "storm"  # the same failure before any step twice in a row, with --storm-guard (run/failure_policy.py)
    CANNOT_HELP = "cannot-help"  # a failure class a restart cannot help, without --restart-any-class (the same)
    TAKEN_OUT = "taken-out"  # an elastic job took this node out for good (agents/exclusions.py): exit 3


@dataclass(frozen=True)
class StopReason:
    """Why a node stops an attempt; the job's exit code is the job-wide reason's, else the first."""

    kind: StopKind
    exit_code: int
    text: str  # what the user is told (a remote reason: the other node's text)
    restartable: bool  # a failure is; a signal, a hang, a lost node, a storm or a class a restart cannot help never is
    node: str | None = None  # whose stop it is (a remote or lost reason: the other node)
    rank: int | None = None  # the failed or stuck rank, where there is one
    evidence: Evidence | None = None  # a failed worker's: what classifies it (run/failure_class.py)

    @property
    def job_wide(self) -> bool:
        """The agents' word on the whole job: it decides the exit code over this node's own reasons."""
        return self.kind in (StopKind.REMOTE, StopKind.LOST)

    @property
    def headline(self) -> str:
        return self.text.splitlines()[0] if self.text else self.kind.value


Timer = tuple[float, Callable[[], None]]


class Participant:
    """Base of every participant: each method's default is "no part in this"."""

    def begin_attempt(self, attempt: int) -> None:
        return None

    def readers(self) -> Mapping[int, Callable[[], None]]:
        return {}

    def timers(self) -> Sequence[Timer]:
        return ()

    def stop_reason(self) -> StopReason | None:
        return None

    def stop_due_in_s(self) -> float | None:
        return None

    def on_stop(self, reason: StopReason) -> None:
        return None

    def holds_attempt(self) -> bool:
        return False

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        return wish

    def exempt_pids(self) -> Iterable[int]:
        return ()

    def attempt_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> tuple[RankPlan, ...]:
        return ranks

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        return None

    def on_spawn(self, rank: int, pid: int) -> None:
        return None

    def end_attempt(self, attempt: int) -> None:
        return None


class Participants:
    """The supervisor's participants, asked as one: each question goes to every participant, in the
    list's order, and the answers combine by the rules of this module's docstring."""

    def __init__(self, members: Sequence[Participant]) -> None:
        self.members = tuple(members)
        self._stopped: set[int] = set()  # the list positions whose stop reason this attempt is taken

    def begin_attempt(self, attempt: int) -> None:
        self._stopped = set()
        for p in self.members:
            p.begin_attempt(attempt)

    def readers(self) -> dict[int, Callable[[], None]]:
        return {fd: call for p in self.members for fd, call in p.readers().items()}

    def timers(self) -> list[Timer]:
        return [timer for p in self.members for timer in p.timers()]

    def attempt_ranks(self, attempt: int, planned: tuple[RankPlan, ...]) -> tuple[RankPlan, ...]:
        answers = [p.attempt_ranks(attempt, planned) for p in self.members]
        return next((ranks for ranks in answers if ranks is not planned), planned)

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        for p in self.members:
            p.begin_ranks(attempt, ranks)

    def poll_stop_reasons(self, stop: Callable[[StopReason, Participant], None]) -> None:
        """Ask every participant without a reason in this attempt for one; ``stop(reason, source)``
        for each new one before the next participant is asked (so it has been told of it)."""
        for position, p in enumerate(self.members):
            if position not in self._stopped and (reason := p.stop_reason()) is not None:
                self._stopped.add(position)
                stop(reason, p)

    def stop_due_in_s(self) -> float | None:
        """The earliest of the participants' own deadlines, of those without a reason in this attempt."""
        due = [p.stop_due_in_s() for position, p in enumerate(self.members) if position not in self._stopped]
        return min((d for d in due if d is not None), default=None)

    def on_stop(self, reason: StopReason, source: Participant | None) -> None:
        """Tell every participant but ``source`` (the one whose reason it is) that this node stops."""
        for p in self.members:
            if p is not source:
                p.on_stop(reason)

    def holds_attempt(self) -> bool:
        holds = [p.holds_attempt() for p in self.members]
        return any(holds)

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        votes = [p.vote_restart(attempt, wish) for p in self.members]
        return wish and all(votes)

    def exempt_pids(self) -> set[int]:
        return {pid for p in self.members for pid in p.exempt_pids()}

    def on_spawn(self, rank: int, pid: int) -> None:
        for p in self.members:
            p.on_spawn(rank, pid)

    def end_attempt(self, attempt: int) -> None:
        for p in self.members:
            p.end_attempt(attempt)
