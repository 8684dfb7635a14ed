"""The supervisor's state machine driven by a recording fake OsLayer and a fake clock.

Covers what real processes cannot show deterministically: exactly which signal goes to which
group when, giving up on a process in uninterruptible sleep, escalation on a second SIGTERM.
"""

from __future__ import annotations

import io
import signal
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from supervise_driver import make_plan

from openclaw_launch.agents.straggler_actions import StragglerActions
from openclaw_launch.agents.straggler_policy import Exclude, StragglerSettings
from openclaw_launch.plan.model import RankPlan
from openclaw_launch.run.osproc import Reaped, Spawned
from openclaw_launch.run.participant import Participant, StopKind, StopReason
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, supervise
from openclaw_launch.stats.judged import Judged

WAKE_FD = 1000
TERM, KILL = signal.SIGTERM, signal.SIGKILL


@dataclass
class FakeProc:
    """Scripted worker: exits with ``exit_code`` ``exit_after`` s after spawn; dies of the signals in ``dies_on``."""

    exit_after: float | None = None
    exit_code: int = 0
    dies_on: frozenset[int] = frozenset({TERM, KILL, signal.SIGINT})
    pid: int = 0
    exit_at: float | None = None
    status: int | None = None
    reaped: bool = False


@dataclass
class FakeOs:
    procs: list[FakeProc]
    signals: list[tuple[float, int]] = field(default_factory=list)  # (time, signal) sent to the launcher
    now: float = 0.0
    calls: list[tuple[float, str, int, int]] = field(default_factory=list)  # (time, call, pid, signal)
    spawned: list[tuple[float, int]] = field(default_factory=list)
    by_pid: dict[int, FakeProc] = field(default_factory=dict)

    def pid(self) -> int:
        return 1

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def set_child_subreaper(self, on: bool) -> bool:
        return False

    def install_signals(self, signals: Iterable[int]) -> int:
        return WAKE_FD

    def restore_signals(self) -> None:
        pass

    def drain_signals(self) -> list[int]:
        due = [s for t, s in self.signals if t <= self.now]
        self.signals = [(t, s) for t, s in self.signals if t > self.now]
        return due

    def watch_fd(self, fd: int) -> None:
        pass

    def unwatch_fd(self, fd: int) -> None:
        pass

    def _next_event(self) -> float | None:
        times = [p.exit_at for p in self.by_pid.values() if p.exit_at is not None and not p.reaped]
        times += [t for t, _ in self.signals]
        return min(times, default=None)

    def wait_fds(self, timeout: float | None) -> list[int]:
        event = self._next_event()
        target = None if timeout is None else self.now + max(timeout, 0.0)
        if event is not None and (target is None or event <= target):
            self.now = max(self.now, event)
            return [WAKE_FD]
        assert target is not None, "the supervisor would block forever"
        self.now = target
        return []

    def read_fd(self, fd: int) -> bytes | None:
        raise AssertionError("no pipes in the fake")

    def close_fd(self, fd: int) -> None:
        raise AssertionError("no pipes in the fake")

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], tty: object = None) -> Spawned:
        proc = self.procs.pop(0)
        proc.pid = 100 + len(self.spawned)
        if proc.exit_after is not None:
            proc.exit_at = self.now + proc.exit_after
            proc.status = proc.exit_code << 8
        self.by_pid[proc.pid] = proc
        self.spawned.append((self.now, proc.pid))
        return Spawned(proc.pid, None, None)

    def killpg(self, pgid: int, sig: int) -> bool:
        self.calls.append((self.now, "killpg", pgid, sig))
        return self._deliver(pgid, sig)

    def kill(self, pid: int, sig: int) -> bool:
        self.calls.append((self.now, "kill", pid, sig))
        return self._deliver(pid, sig)

    def _deliver(self, pid: int, sig: int) -> bool:
        proc = self.by_pid.get(pid)
        if proc is None or proc.reaped or (proc.exit_at is not None and proc.exit_at <= self.now):
            return False
        if sig in proc.dies_on:
            proc.exit_at, proc.status = self.now, sig
        return True

    def reap(self) -> list[Reaped]:
        out = []
        for proc in self.by_pid.values():
            if not proc.reaped and proc.exit_at is not None and proc.exit_at <= self.now:
                proc.reaped = True
                assert proc.status is not None
                out.append(Reaped(proc.pid, proc.status, 0.0, 0))
        return out

    def proc_status(self, pid: int) -> dict[str, str] | None:
        return None

    def proc_comm(self, pid: int) -> str | None:
        return None

    def descendants(self, exempt: Collection[int] = ()) -> list[int]:
        return [p.pid for p in self.by_pid.values() if not p.reaped and p.pid not in exempt]

    def descendant_groups(self, exempt: Collection[int] = ()) -> set[int]:
        return set(self.descendants(exempt))

    def read_error_file(self, path: str) -> str | None:
        return None

    def open_log(self, path: str) -> io.BytesIO:
        raise AssertionError("no log_dir in these tests")

    def read_text(self, path: str) -> str | None:
        return None

    def fresh_file(self, path: str) -> None:
        pass

    def signals_sent(self, sig: int) -> list[tuple[float, int]]:
        return [(t, pid) for t, call, pid, s in self.calls if s == sig and call == "killpg"]


def run(fake: FakeOs, n: int, participants: Sequence[Participant] = (), **kw: object) -> JobResult:
    options = SuperviseOptions(use_guardian=False, stderr=io.StringIO(), **kw)  # type: ignore[arg-type]
    return supervise(make_plan(n, []), options, fake, participants)


def test_failure_sigterms_all_groups_then_sigkills_survivors_after_grace() -> None:
    fake = FakeOs([FakeProc(exit_after=1.0, exit_code=3), FakeProc(dies_on=frozenset({KILL}))])
    result = run(fake, 2, grace_period_s=3.0)
    # 100 was reaped and nothing of ours is left in its group: its id is no longer ours to signal
    assert fake.signals_sent(TERM) == [(1.0, 101)]
    assert (4.0, 101) in fake.signals_sent(KILL)
    assert result.exit_code == 3
    assert result.root_cause is not None and result.root_cause.rank == 0
    assert result.results[0][1].signal == KILL


def test_unkillable_worker_is_given_up_after_kill_timeout() -> None:
    fake = FakeOs([FakeProc(exit_after=1.0, exit_code=2), FakeProc(dies_on=frozenset())])
    result = run(fake, 2, grace_period_s=3.0, kill_timeout_s=2.0)
    assert result.unkillable == (101,)
    assert result.exit_code == 2
    assert fake.now >= 6.0
    stuck = result.results[0][1]
    assert stuck.exit_code is None and stuck.signal is None and not stuck.succeeded


def test_signal_is_forwarded_and_second_sigterm_escalates_at_once() -> None:
    stubborn = frozenset({KILL})
    fake = FakeOs([FakeProc(dies_on=stubborn), FakeProc(dies_on=stubborn)], signals=[(2.0, TERM), (2.5, TERM)])
    result = run(fake, 2, grace_period_s=30.0)
    assert fake.signals_sent(TERM) == [(2.0, 100), (2.0, 101)]
    assert fake.signals_sent(KILL)[:2] == [(2.5, 100), (2.5, 101)]
    assert result.exit_code == 128 + TERM
    assert result.signal_received == TERM and result.root_cause is None


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT])
def test_other_signals_forwarded_as_themselves(sig: int) -> None:
    fake = FakeOs([FakeProc(dies_on=frozenset({sig, KILL}))], signals=[(1.0, sig)])
    result = run(fake, 1)
    assert [s for _, call, _, s in fake.calls if call == "killpg"][0] == sig
    assert result.exit_code == 128 + sig


def test_restart_with_exponential_backoff_and_hooks() -> None:
    procs = [FakeProc(exit_after=1.0, exit_code=1), FakeProc(exit_after=1.0, exit_code=1)]
    procs += [FakeProc(exit_after=1.0)]
    fake = FakeOs(procs)
    seen: list[tuple[str, int]] = []

    class Recorder(Participant):
        def begin_attempt(self, attempt: int) -> None:
            seen.append(("before", attempt))

        def end_attempt(self, attempt: int) -> None:
            seen.append(("after", attempt))

    result = run(fake, 1, [Recorder()], max_restarts=5, restart_backoff_s=0.5)
    assert result.exit_code == 0 and result.attempts == 3
    # attempt 0 ends at 1.0, the first restart waits nothing; attempt 1 ends at 2.0, backoff 0.5 -> 2.5
    assert [t for t, _ in fake.spawned] == [0.0, 1.0, 2.5]
    assert seen == [("before", 0), ("after", 0), ("before", 1), ("after", 1), ("before", 2), ("after", 2)]


def test_signal_during_backoff_ends_the_job() -> None:
    procs = [FakeProc(exit_after=1.0, exit_code=1), FakeProc(exit_after=1.0, exit_code=1)]
    fake = FakeOs(procs, signals=[(3.0, signal.SIGINT)])  # the first restart waits nothing, the second 10 s
    result = run(fake, 1, max_restarts=3, restart_backoff_s=10.0)
    assert result.attempts == 2
    assert result.exit_code == 1  # the root cause's code wins over the later signal
    assert result.signal_received == signal.SIGINT


def test_exempt_pids_are_not_killed_as_leftovers() -> None:
    daemon = FakeProc(dies_on=frozenset({KILL}))
    fake = FakeOs([FakeProc(exit_after=1.0)])
    fake.by_pid[50] = daemon
    daemon.pid = 50

    class Daemon(Participant):
        def exempt_pids(self) -> list[int]:
            return [50]

    result = run(fake, 1, [Daemon()])
    assert result.exit_code == 0
    assert not [c for c in fake.calls if c[2] == 50]


class Scripted(Participant):
    """A participant that gives ``reason`` once the fake clock reaches ``at`` (in attempt ``in_attempt``),
    and records what the supervisor tells it."""

    def __init__(self, fake: FakeOs, reason: StopReason | None = None, at: float = 0.0, in_attempt: int = 0) -> None:
        self.fake, self.reason, self.at, self.in_attempt = fake, reason, at, in_attempt
        self.attempt = -1
        self.told: list[tuple[int, StopKind]] = []
        self.votes: list[tuple[int, bool]] = []

    def begin_attempt(self, attempt: int) -> None:
        self.attempt = attempt

    def timers(self) -> list[tuple[float, Callable[[], None]]]:
        return [(0.5, lambda: None)]  # the loop wakes up to ask for the reason

    def stop_reason(self) -> StopReason | None:
        due = self.attempt == self.in_attempt and self.fake.now >= self.at
        return self.reason if due else None

    def on_stop(self, reason: StopReason) -> None:
        self.told.append((self.attempt, reason.kind))

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        self.votes.append((attempt, wish))
        return wish


HANG = StopReason(StopKind.HANG, 124, "hang: rank 0", False, "node0", 0)


def test_a_participants_stop_reason_stops_every_group_tells_the_others_and_is_never_restarted() -> None:
    fake = FakeOs([FakeProc(), FakeProc()])
    hang, other = Scripted(fake, HANG, at=2.0), Scripted(fake)
    result = run(fake, 2, [hang, other], max_restarts=3, grace_period_s=5.0)
    assert fake.signals_sent(TERM)[:2] == [(2.0, 100), (2.0, 101)]
    assert result.exit_code == 124 and result.attempts == 1 and result.root_cause is None
    assert other.told == [(0, StopKind.HANG)] and hang.told == []  # the source is not told its own reason
    assert other.votes == [(0, False)]  # the node's own wish: a hang is not restartable


def test_a_failure_restarts_unless_a_participant_votes_no_and_the_next_attempt_starts_afresh() -> None:
    fake = FakeOs([FakeProc(exit_after=1.0, exit_code=3), FakeProc(exit_after=1.0)])
    watcher = Scripted(fake, HANG, at=0.0, in_attempt=1)  # a reason in attempt 1 only
    result = run(fake, 1, [watcher], max_restarts=3, restart_backoff_s=0.5)
    assert watcher.told == [(0, StopKind.FAILURE)] and watcher.votes == [(0, True), (1, False)]
    assert result.attempts == 2 and result.exit_code == 124

    class Veto(Participant):
        def vote_restart(self, attempt: int, wish: bool) -> bool:
            return False

    fake = FakeOs([FakeProc(exit_after=1.0, exit_code=3)])
    result = run(fake, 1, [Veto()], max_restarts=3)
    assert result.attempts == 1 and result.exit_code == 3


def test_the_job_wide_reason_decides_the_exit_code_over_this_nodes_first() -> None:
    fake = FakeOs([FakeProc(exit_after=1.0, exit_code=3)])
    remote = StopReason(StopKind.REMOTE, 124, "node node1: hang: rank 2", False, "node1", 2)
    agent = Scripted(fake, remote, at=1.0)  # came in the same step as the local failure, second
    result = run(fake, 1, [agent], max_restarts=3)
    assert agent.told == [(0, StopKind.FAILURE)]
    assert result.exit_code == 124 and result.attempts == 1
    assert result.root_cause is not None and result.root_cause.exit_code == 3  # still this node's root cause


def test_a_signal_while_stopping_for_a_failure_is_a_reason_too_no_restart() -> None:
    fake = FakeOs([FakeProc(exit_after=1.0, exit_code=3), FakeProc(dies_on=frozenset({KILL}))], signals=[(2.0, TERM)])
    other = Scripted(fake)
    result = run(fake, 2, [other], max_restarts=3, grace_period_s=30.0)
    assert other.told == [(0, StopKind.FAILURE), (0, StopKind.SIGNAL)]
    assert result.attempts == 1 and result.exit_code == 3  # the root cause's code, as before
    assert (2.0, 101) in fake.signals_sent(KILL)  # the second stop request escalates


class Witness(Participant):
    """Records every question the supervisor asks it; answers with ``ranks_of`` (the ranks it wants
    of the plan's), ``reason`` from the clock's ``at``, ``vote`` and ``holds`` (until the clock's
    ``holds_until``)."""

    def __init__(
        self,
        fake: FakeOs,
        ranks_of: slice | None = None,
        reason: StopReason | None = None,
        at: float = 0.0,
        vote: bool = True,
        holds_until: float = 0.0,
    ) -> None:
        self.fake, self.ranks_of, self.reason, self.at = fake, ranks_of, reason, at
        self.vote, self.holds_until = vote, holds_until
        self.asked: list[tuple[str, float]] = []  # (question, the clock then)
        self.planned: list[tuple[object, ...]] = []  # the ranks ``attempt_ranks`` was given
        self.began: list[int] = []  # how many ranks ``begin_ranks`` was told of
        self.told: list[StopKind] = []

    def timers(self) -> list[tuple[float, Callable[[], None]]]:
        return [(0.5, lambda: None)]

    def attempt_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> tuple[RankPlan, ...]:
        self.asked.append(("attempt_ranks", self.fake.now))
        self.planned.append(ranks)
        return ranks if self.ranks_of is None else ranks[self.ranks_of]

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        self.began.append(len(ranks))

    def stop_reason(self) -> StopReason | None:
        self.asked.append(("stop_reason", self.fake.now))
        return self.reason if self.reason is not None and self.fake.now >= self.at else None

    def on_stop(self, reason: StopReason) -> None:
        self.told.append(reason.kind)

    def holds_attempt(self) -> bool:
        self.asked.append(("holds_attempt", self.fake.now))
        return self.fake.now < self.holds_until

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        self.asked.append(("vote_restart", self.fake.now))
        return self.vote and wish


def test_every_participant_is_asked_every_question_and_the_first_answer_by_list_order_counts() -> None:
    """The attempt's ranks: every one is asked with the plan's, the first other answer is the
    attempt's; two reasons in one step: both kept and told, the first's exit code; the holds and the
    restart votes: every one asked, one "no" ends the job."""
    lost = StopReason(StopKind.LOST, 75, "node node1 is lost", True, "node1")
    fake = FakeOs([FakeProc(dies_on=frozenset({TERM}))])
    first = Witness(fake, ranks_of=slice(0, 1), reason=HANG, at=2.0, vote=False)
    second = Witness(fake, ranks_of=slice(1, 2), reason=lost, at=2.0, holds_until=3.0)
    third = Witness(fake)
    result = run(fake, 2, [first, second, third], max_restarts=3)
    planned = first.planned[0]
    assert len(planned) == 2 and all(w.planned == [planned] for w in (second, third))  # never another's answer
    assert [w.began for w in (first, second, third)] == [[1]] * 3  # the first answer other than the plan's
    assert len(fake.spawned) == 1
    assert first.told == [StopKind.LOST] and second.told == [StopKind.HANG]  # each told of the other's
    assert third.told == [StopKind.HANG, StopKind.LOST]
    assert result.exit_code == 75 and result.attempts == 1  # the job-wide reason's code; a "no" vote and a hang
    for w in (first, second, third):
        questions = [q for q, _ in w.asked]
        assert questions.count("attempt_ranks") == 1 and questions.count("vote_restart") == 1
        assert ("holds_attempt", 3.0) in w.asked  # every one, also while the second holds the attempt
    for w in (first, second):  # asked until it gave its reason, at 2.0
        assert [t for q, t in w.asked if q == "stop_reason" and t >= 2.0] == [2.0]
    assert [t for q, t in third.asked if q == "stop_reason"][-1] >= 3.0  # every step while the attempt is open


class GraceWatch(Participant):
    """An ``exclude`` fate seen from the start: the straggler actions' checkpoint request at the first
    poll, then their stop at the grace's end; a keep-alive tick like the agent's counts the wake-ups."""

    def __init__(self, fake: FakeOs, grace_s: float, tick_s: float) -> None:
        settings = StragglerSettings(policy="exclude", grace_s=grace_s)
        named = Judged(0, True, 0.12, "node1", 1, 1, 30.0, "input", "host")
        self.actions = StragglerActions(settings, lambda line: None, lambda pid, sig: None, fake.monotonic)
        self.fate = self.actions.fate_of(Exclude("node1", 1, 0, (named,) * 3, 0.1))
        self.fake, self.tick_s = fake, tick_s
        self.events: list[tuple[str, float]] = []

    def timers(self) -> list[tuple[float, Callable[[], None]]]:
        return [(self.tick_s, lambda: self.events.append(("tick", self.fake.now)))]

    def stop_reason(self) -> StopReason | None:
        first = self.actions.stop_due_in_s() is None
        reason = self.actions.stop_reason(self.fate)
        if first:
            self.events.append(("asked", self.fake.now))
        if reason is not None:
            self.events.append(("stop", self.fake.now))
        return reason

    def stop_due_in_s(self) -> float | None:
        return self.actions.stop_due_in_s()


def test_the_grace_ends_the_loops_wait_the_stop_comes_then_not_at_the_next_tick() -> None:
    fake = FakeOs([FakeProc()])
    watch = GraceWatch(fake, grace_s=0.6, tick_s=0.25)
    result = run(fake, 1, [watch], grace_period_s=5.0)
    assert result.attempts == 1  # one restartable stop, no restarts left
    kinds = [kind for kind, _ in watch.events]
    asked_at, stopped_at = watch.events[kinds.index("asked")][1], watch.events[kinds.index("stop")][1]
    between = kinds[kinds.index("asked") + 1 : kinds.index("stop")]
    assert between == ["tick", "tick"]  # at +0.25 and +0.5; the stop comes before the third tick (+0.75)
    assert stopped_at == pytest.approx(asked_at + 0.6)  # on the fake clock: at the grace's end
    assert fake.signals_sent(TERM) == [(stopped_at, 100)]  # the workers are stopped then
