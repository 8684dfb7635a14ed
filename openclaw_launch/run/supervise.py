"""Turn a LaunchPlan into running workers, watch them, and never leave an orphan: the supervisor's
state machine.

One thread, one event loop (``run/event_loop.py``) for signals, worker output and the
participants' descriptors. The job is an explicit state machine::

    STARTING -> RUNNING -> STOPPING (a stop reason: SIGTERM/the signal to every group,
                                     SIGKILL after grace_period_s, give up after kill_timeout_s)
                        -> RESTARTING (the node wishes it, no participant says no; backoff) -> STARTING ...
                        -> DONE

The parts that take part in supervision are ``Participant``s (``run/participant.py``), one list
of which every one is asked each question at the same points. An attempt stops for the first
``StopReason`` (a failed worker, a signal, a participant's reason); it restarts iff every reason of
it is restartable, attempts are left and no participant votes no; the exit code is the job-wide
reason's (the agents' fate), else the first one's. Starting a worker is ``run/spawn.py``'s, its
output on the console ``run/streams.py``'s, stopping the workers ``run/teardown.py``'s. Every OS
call goes through an ``OsLayer`` (``osproc.RealOs``; a fake in tests). Call ``supervise`` from the
main thread: it installs signal handlers and reaps every child of this process while it runs.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from openclaw_launch.config import defaults
from openclaw_launch.config.signals import signal_numbers
from openclaw_launch.plan.context import LogDir
from openclaw_launch.run.event_loop import EventLoop
from openclaw_launch.run.guard import Guardian
from openclaw_launch.run.helper import running_helpers
from openclaw_launch.run.osproc import OsLayer, RealOs, Reaped
from openclaw_launch.run.participant import Participant, Participants, StopKind, StopReason
from openclaw_launch.run.results import (
    JobResult,
    WorkerResult,
    format_root_cause,
    format_summary,
    signal_name,
    why_ended,
)
from openclaw_launch.run.spawn import Spawner
from openclaw_launch.run.streams import LauncherStreams
from openclaw_launch.run.teardown import Teardown
from openclaw_launch.run.worker_record import AttemptFiles, Logs, WorkerRecord, attempt_results, close_logs

if TYPE_CHECKING:  # plan.py pulls in config/yaml; the supervisor only needs the shapes
    from openclaw_launch.plan.build import LaunchPlan, RankPlan

ESCALATING_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a second one while stopping means "SIGKILL now"


def restart_delay_s(attempt: int, backoff_s: float, backoff_max_s: float) -> float:
    """The wait after attempt ``attempt`` (0-based) failed, before the next: none before the first restart
    (torchrun waits none; one failure is no storm to slow down), then ``backoff_s`` doubling, at most
    ``backoff_max_s``, against a failure that keeps coming back."""
    if attempt == 0:
        return 0.0
    return min(backoff_s * 2 ** min(attempt - 1, 64), backoff_max_s)


class State(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    DONE = "done"


@dataclass(frozen=True)
class SuperviseOptions:
    grace_period_s: float = defaults.GRACE_PERIOD_S  # SIGTERM -> SIGKILL (torchrun's default shutdown timeout)
    kill_timeout_s: float = defaults.KILL_TIMEOUT_S  # SIGKILL -> give up (uninterruptible sleep)
    max_restarts: int = 0
    restart_any_class: bool = False  # restart a failure class a restart cannot help too (run/failure_policy.py)
    storm_guard: bool = False  # stop a restart storm (run/failure_policy.py)
    # the first restart waits nothing (as torchrun); restart k >= 2 waits restart_backoff_s * 2**(k-2) ...
    restart_backoff_s: float = defaults.RESTART_BACKOFF_S
    restart_backoff_max_s: float = defaults.RESTART_BACKOFF_MAX_S  # ... at most this
    log_dir: str | None = None  # each rank's logs there: plan/context.LogDir
    console_ranks: frozenset[int] | None = None  # None = every rank reaches the console
    console_hidden: frozenset[tuple[int, str]] = frozenset()  # (local rank or -1 = all, stream) kept off it
    forwarded_signals: tuple[int, ...] = signal_numbers(defaults.HANDLED_SIGNALS)  # torchrun's --signals-to-handle
    pass_signals: tuple[int, ...] = ()  # forwarded to the workers WITHOUT stopping them (--forward-signals)
    error_files_kept: bool = True  # the workers' error files outlive the job (the summary may name them)
    prefix_template: str = defaults.CONSOLE_PREFIX  # keys: rank, local_rank, node, attempt
    readback_delay_s: float = 0.05  # first binding read-back after start; doubles per retry
    readback_attempts: int = 6  # read-backs while the worker is still numactl
    stderr_tail_lines: int = 50
    cleanup_poll_s: float = 0.01  # leftover grandchildren are re-checked this often (bounded)
    use_guardian: bool = True  # fork a guardian that cleans up if the launcher is SIGKILLed
    print_summary: bool = True  # root-cause summary on stderr when the job fails
    stdout: TextIO | None = None  # console streams; None = sys.stdout / sys.stderr at call time
    stderr: TextIO | None = None


def supervise(
    plan: LaunchPlan,
    options: SuperviseOptions | None = None,
    os_layer: OsLayer | None = None,
    participants: Sequence[Participant] = (),
    *,
    guardian: Guardian | None = None,
) -> JobResult:
    """Run the plan's local ranks until they all succeed, or stop and restarts are not to be.

    ``guardian``: pass the launcher's guardian to share it (the caller closes it); otherwise one is
    started and closed here when ``options.use_guardian``.
    """
    options = options or SuperviseOptions()
    own_guardian = guardian is None and options.use_guardian
    if own_guardian:
        guardian = Guardian.start()
    try:
        return _Supervisor(plan, options, os_layer or RealOs(), Participants(participants), guardian).run()
    finally:
        if own_guardian and guardian is not None:
            guardian.close()


class _Supervisor:
    def __init__(
        self,
        plan: LaunchPlan,
        options: SuperviseOptions,
        os_layer: OsLayer,
        participants: Participants,
        guardian: Guardian | None,
    ) -> None:
        self.plan = plan
        self.opt = options
        self.os = os_layer
        self.participants = participants
        self.guardian = guardian
        hint = str(LogDir.of(options.log_dir, plan.run_id).path) if options.log_dir else None
        self.streams = LauncherStreams(options.stdout, options.stderr, hint)
        self.files = AttemptFiles(os_layer, options.log_dir, plan.run_id, self.streams.say)
        self.loop = EventLoop(os_layer, participants.readers(), (self.streams.stdout, self.streams.stderr))
        self.teardown = Teardown(os_layer, self.loop, options.grace_period_s, options.kill_timeout_s, self._exempt)
        self.spawner = Spawner(os_layer, self.loop, self.streams, self.files, options)
        self._guardian_warned = False
        self.state = State.STARTING
        self.signal_received: int | None = None
        # per attempt
        self.workers: list[WorkerRecord] = []
        self.live: dict[int, WorkerRecord] = {}
        self.failure: WorkerRecord | None = None
        self.reasons: list[StopReason] = []  # why the attempt stops, in the order they came
        self.attempt_open = False

    # ---- top level -------------------------------------------------------------------------------

    def run(self) -> JobResult:
        old_subreaper = self.os.set_child_subreaper(True)
        self.loop.install_signals((*self.opt.forwarded_signals, signal.SIGCHLD))
        self.loop.watch_readers()
        try:
            return self._run_attempts()
        finally:
            self.loop.unwatch_readers()
            try:
                if self.attempt_open:  # an exception escaped (e.g. from a participant): still no orphan
                    self._finish_attempt()
            finally:
                self.os.restore_signals()
                self.os.set_child_subreaper(old_subreaper)

    def _run_attempts(self) -> JobResult:
        all_results: list[tuple[WorkerResult, ...]] = []
        root_causes: list[WorkerResult | None] = []
        root_cause: WorkerResult | None = None
        attempt = 0
        while True:
            self.state = State.STARTING
            self.participants.begin_attempt(attempt)
            results, root_cause = self._run_attempt(attempt)
            all_results.append(results)
            root_causes.append(root_cause)
            self.participants.end_attempt(attempt)
            if not self.participants.vote_restart(attempt, self._restart_wish(attempt)):
                break
            self._backoff(attempt)
            if self.signal_received is not None:
                break
            why = why_ended(root_cause) if root_cause is not None else self.reasons[0].headline
            attempt += 1
            self.streams.say(f"openclaw-launch: attempt {attempt + 1}/{self.opt.max_restarts + 1} after {why}")
        self.state = State.DONE
        job = JobResult(
            exit_code=self._exit_code(all_results[-1]),
            root_cause=root_cause,
            attempts=len(all_results),
            results=tuple(all_results),
            signal_received=self.signal_received,
            unkillable=tuple(self.teardown.unkillable),
            root_causes=tuple(root_causes),
            log_errors=tuple(self.files.log_errors),
            guardian_lost=self._guardian_lost(),
        )
        summary = format_summary(job, self.opt.kill_timeout_s, self.opt.error_files_kept)
        if self.opt.print_summary and summary:
            self.streams.say(summary)
        return job

    def _restart_wish(self, attempt: int) -> bool:
        """This node's own wish: the attempt stopped, only for restartable reasons, attempts are left."""
        restartable = bool(self.reasons) and all(r.restartable for r in self.reasons)
        return restartable and self.signal_received is None and attempt < self.opt.max_restarts

    def _exit_code(self, last: tuple[WorkerResult, ...]) -> int:
        """The job-wide reason's code (the agents' fate, the same on every node), else this node's first."""
        decided = next((r for r in self.reasons if r.job_wide), self.reasons[0] if self.reasons else None)
        if decided is not None:
            return decided.exit_code
        if self.signal_received is not None:
            return 128 + self.signal_received
        return 0 if all(r.succeeded for r in last) else 1

    # ---- one attempt -----------------------------------------------------------------------------

    def _run_attempt(self, attempt: int) -> tuple[tuple[WorkerResult, ...], WorkerResult | None]:
        self.workers, self.live = [], {}
        self.teardown.begin(self.workers, self.live)
        self.attempt_open = True
        self.failure = None
        self.reasons = []
        planned = self.plan.attempt_ranks(attempt)  # this attempt's restart count and error files
        ranks = self.participants.attempt_ranks(attempt, planned)  # an elastic job's new world
        self.participants.begin_ranks(attempt, ranks)
        logs = self.files.prepare(ranks, attempt)  # raises before any worker of the attempt starts
        for rank, rank_logs in zip(ranks, logs, strict=True):
            if self.state is State.STARTING:
                self._spawn(rank, attempt, rank_logs)
            else:  # a spawn failed: do not start the rest
                close_logs(rank_logs)
        if self.state is State.STARTING:
            self.state = State.RUNNING
        for interval_s, callback in self.participants.timers():  # they run while the attempt is open
            self.loop.repeat(interval_s, callback, lambda: self.attempt_open)
        self._loop(self._attempt_over)
        return self._finish_attempt()

    def _attempt_over(self) -> bool:
        """Its workers are gone and no participant holds it, or the kill timeout gave up on them."""
        return (not self.live and not self.participants.holds_attempt()) or self.teardown.gave_up

    def _finish_attempt(self) -> tuple[tuple[WorkerResult, ...], WorkerResult | None]:
        """After the workers: kill leftovers, drain output, turn records into results."""
        self.state = State.STOPPING
        self.attempt_open = False
        self.teardown.kill_leftovers(self._step, self.opt.cleanup_poll_s)
        self.live.clear()
        self.loop.clear_timers()
        self.loop.drain_streams()
        if self.guardian is not None:
            for w in self.workers:
                if w.pid is not None and w.pid not in self.teardown.unkillable:
                    self.guardian.unwatch_pgid(w.pid)
        return attempt_results(self.workers, self.failure, self.os.read_error_file)

    def _spawn(self, rank: RankPlan, attempt: int, logs: Logs) -> None:
        w = self.spawner.start(rank, attempt, logs)
        self.workers.append(w)
        if w.pid is None:  # could not be started: a failure like any other
            self._failed(w)
            return
        self.live[w.pid] = w
        self.participants.on_spawn(rank.rank, w.pid)
        if self.guardian is not None:
            self.guardian.watch_pgid(w.pid)

    # ---- event loop ------------------------------------------------------------------------------

    def _loop(self, done: Callable[[], bool]) -> None:
        while not done():
            self._step(self._next_timeout())

    def _next_timeout(self) -> float | None:
        """The next timer's, or sooner where a participant's stop reason comes due first (an open attempt)."""
        timeout = self.loop.next_timeout()
        due_s = self.participants.stop_due_in_s() if self.attempt_open else None
        return due_s if due_s is not None and (timeout is None or due_s < timeout) else timeout

    def _step(self, timeout: float | None) -> None:
        for sig in self.loop.wait(timeout):
            self._on_signal(sig)
        for reaped in self.os.reap():
            self._on_reaped(reaped)
        self.loop.run_timers()
        if self.attempt_open:
            self.participants.poll_stop_reasons(self._stop_for)
        self.loop.flush_consoles()

    # ---- transitions -----------------------------------------------------------------------------

    def _stop_for(self, reason: StopReason, source: Participant | None = None, sig: int = signal.SIGTERM) -> None:
        """Record why this node stops, tell every other participant, stop the workers (once)."""
        self.reasons.append(reason)
        self.participants.on_stop(reason, source)
        if self.state in (State.STARTING, State.RUNNING):
            self.state = State.STOPPING
            self.teardown.stop(sig)

    def _failed(self, w: WorkerRecord) -> None:
        self.failure = w
        self.loop.read_pending()  # its last words (a traceback, NCCL's) into its tail before it is judged
        result = w.result(None, None)
        code = result.code if result.code is not None else 1
        text = format_root_cause(result, self.opt.error_files_kept)
        evidence = w.evidence(self.os.read_error_file)
        self._stop_for(StopReason(StopKind.FAILURE, code, text, True, w.rank.node, w.rank.rank, evidence))

    def _on_reaped(self, reaped: Reaped) -> None:
        w = self.live.pop(reaped.pid, None)
        if w is None:  # an orphan, a zombie (PID 1) or a daemon: collecting it was the point
            if self.guardian is not None and reaped.pid == self.guardian.pid:
                self.guardian.died(reaped.status)
                self._guardian_lost()
            return
        w.ended(reaped, self.os.time(), self.os.monotonic())
        if w.failed and self.state is State.RUNNING:
            self._failed(w)

    def _on_signal(self, sig: int) -> None:
        if sig in self.opt.pass_signals:  # forwarded only (SIGUSR1 = checkpoint now): the job goes on
            if self.attempt_open:
                self.teardown.signal_groups(sig)
            return
        first = self.signal_received is None
        if first:
            self.signal_received = sig
        stopping = self.state is State.STOPPING
        if first and self.attempt_open:  # also while stopping for a failure: no restart, every node told
            text = f"its launcher received {signal_name(sig)}"
            self._stop_for(StopReason(StopKind.SIGNAL, 128 + sig, text, False, self.plan.node), sig=sig)
        if stopping:
            if sig in ESCALATING_SIGNALS:
                self.teardown.kill_groups()
            else:
                self.teardown.signal_groups(sig)
        # RESTARTING: no workers; the backoff loop sees signal_received and ends the job

    def _exempt(self) -> set[int]:
        """Processes never killed as leftovers (with everything under them): the guardian, this
        launcher's helper processes (run/helper.py), what the participants name."""
        exempt = {self.guardian.pid} if self.guardian is not None else set()
        exempt.update(running_helpers())
        exempt.update(self.participants.exempt_pids())
        return exempt

    def _guardian_lost(self) -> str | None:
        if self.guardian is None:
            return None
        lost = self.guardian.lost
        if lost is not None and not self._guardian_warned:
            self._guardian_warned = True
            self.streams.say(
                f"openclaw-launch: warning: the guardian is gone ({lost}): if this launcher is killed now, "
                "its workers' children are not cleaned up"
            )
        return lost

    def _backoff(self, attempt: int) -> None:
        self.state = State.RESTARTING
        delay = restart_delay_s(attempt, self.opt.restart_backoff_s, self.opt.restart_backoff_max_s)
        expired: list[bool] = []
        self.loop.at(delay, lambda: expired.append(True))
        self._loop(lambda: bool(expired) or self.signal_received is not None)
        self.loop.clear_timers()
