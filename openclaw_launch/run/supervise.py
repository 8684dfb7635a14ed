"""Turn a LaunchPlan into running workers, watch them, and never leave an orphan.

One thread, one event loop: SIGCHLD and the forwarded signals arrive through
``signal.set_wakeup_fd``, worker output through pipes, both in one selector, so
a worker's exit is seen at once and an idle launcher uses no CPU. The job is an
explicit state machine::

    STARTING -> RUNNING -> STOPPING (failure or signal: SIGTERM/the signal to every group,
                                     SIGKILL after grace_period_s, give up after kill_timeout_s)
                        -> RESTARTING (attempts left, backoff) -> STARTING ...
                        -> DONE

Every OS call goes through an ``OsLayer`` (``osproc.RealOs``) so the state
machine can be driven by a fake in tests. Call ``supervise`` from the main thread:
it installs signal handlers and reaps every child of this process while it runs.

Worker output (log files, console lines, the stderr tail) is ``worker_output``'s; the result
types and the root-cause text are ``results``' (re-exported here).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, TextIO

from openclaw_launch.config import defaults
from openclaw_launch.config.signals import signal_numbers
from openclaw_launch.errors import LaunchError
from openclaw_launch.run import console
from openclaw_launch.run.guard import Guardian
from openclaw_launch.run.osproc import OsLayer, RealOs, Reaped
from openclaw_launch.run.results import (
    JobResult,
    WorkerResult,
    format_root_cause,
    read_error_file,
    signal_name,
    why_ended,
)
from openclaw_launch.run.worker_output import ConsoleLine, WorkerStream
from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist

if TYPE_CHECKING:  # plan.py pulls in config/yaml; the supervisor only needs the shapes
    from openclaw_launch.plan.build import LaunchPlan, RankPlan

ESCALATING_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a second one while stopping means "SIGKILL now"
_MAX_DRAIN = 16 << 20  # bytes read from a pipe after its worker is gone, at most
_CONSOLE_RETRY_S = 0.05  # a console that did not take everything is retried this often


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
    restart_backoff_s: float = defaults.RESTART_BACKOFF_S  # attempt k waits restart_backoff_s * 2**k ...
    restart_backoff_max_s: float = defaults.RESTART_BACKOFF_MAX_S  # ... at most this
    log_dir: str | None = None  # <log_dir>/<run_id>/attempt-<n>/rank-<r>/{stdout,stderr}.log
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


@dataclass(frozen=True)
class SuperviseHooks:
    """Callbacks for modules that own resources across attempts (MPS)."""

    before_attempt: Callable[[int], None] | None = None
    after_attempt: Callable[[int, tuple[WorkerResult, ...]], None] | None = None
    exempt_pids: Callable[[], Iterable[int]] | None = None  # never killed as leftovers (with their children)
    readers: Mapping[int, Callable[[], None]] = field(default_factory=dict)  # fd -> call when readable
    every: tuple[float, Callable[[], None]] | None = None  # (interval_s, callback) while workers run
    periodic: tuple[tuple[float, Callable[[], None]], ...] = ()  # more of the same
    # Asked after each loop step while workers run: an exit code to stop the job with (a hang,
    # openclaw_launch/stats/hang.py), or None. The job then stops as on a failure, without restart.
    stop_code: Callable[[], int | None] | None = None
    # Multi-node agents (openclaw_launch/agents): told when this node starts stopping for a reason of
    # its own (a failed worker, or a signal); asked after each reader whether to stop for another
    # node's reason; ``hold`` keeps an attempt open after its workers are gone until every node is
    # done; ``decide_restart`` turns this node's restart wish into the job's decision.
    on_stopping: Callable[[WorkerResult | None, int | None], None] | None = None
    remote_stop: Callable[[], bool] | None = None
    hold: Callable[[], bool] | None = None
    decide_restart: Callable[[int, bool], bool] | None = None


def supervise(
    plan: LaunchPlan,
    options: SuperviseOptions | None = None,
    os_layer: OsLayer | None = None,
    hooks: SuperviseHooks | None = None,
    *,
    guardian: Guardian | None = None,
) -> JobResult:
    """Run the plan's local ranks until they all succeed, or fail/are signalled and restarts run out.

    ``guardian``: pass the launcher's guardian to share it (the caller closes it); otherwise one is
    started and closed here when ``options.use_guardian``.
    """
    options = options or SuperviseOptions()
    own_guardian = guardian is None and options.use_guardian
    if own_guardian:
        guardian = Guardian.start()
    try:
        sup = _Supervisor(plan, options, os_layer or RealOs(), hooks or SuperviseHooks(), guardian)
        return sup.run()
    finally:
        if own_guardian and guardian is not None:
            guardian.close()


def _close_logs(logs: dict[str, BinaryIO | None]) -> None:
    for log in logs.values():
        if log is not None:
            log.close()


def _parse_cpulist(text: str) -> tuple[int, ...] | None:
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


@dataclass
class _Worker:
    rank: RankPlan
    attempt: int
    start_s: float
    mono_start_s: float = 0.0
    pid: int | None = None
    finished: bool = False
    exit_code: int | None = None
    signal: int | None = None
    end_s: float | None = None
    cpu_s: float | None = None
    max_rss_kib: int | None = None
    bound_cpus: tuple[int, ...] | None = None
    bound_mems: tuple[int, ...] | None = None
    binding_warning: str | None = None
    readbacks_left: int = 0
    tail: deque[str] = field(default_factory=deque)
    wall_s: float | None = None

    @property
    def failed(self) -> bool:
        return self.exit_code != 0

    def result(self, error_file: str | None, error: str | None) -> WorkerResult:
        return WorkerResult(
            rank=self.rank.rank,
            local_rank=self.rank.local_rank,
            node=self.rank.node,
            attempt=self.attempt,
            pid=self.pid,
            exit_code=self.exit_code,
            signal=self.signal,
            start_s=self.start_s,
            end_s=self.end_s,
            cpu_s=self.cpu_s,
            max_rss_kib=self.max_rss_kib,
            bound_cpus=self.bound_cpus,
            bound_mems=self.bound_mems,
            binding_warning=self.binding_warning,
            stderr_tail=tuple(self.tail),
            error_file=error_file if error else None,
            error=error,
            wall_s=self.wall_s,
        )


class _Supervisor:
    def __init__(
        self,
        plan: LaunchPlan,
        options: SuperviseOptions,
        os_layer: OsLayer,
        hooks: SuperviseHooks,
        guardian: Guardian | None,
    ) -> None:
        self.plan = plan
        self.opt = options
        self.os = os_layer
        self.hooks = hooks
        self.guardian = guardian
        hint = f"{options.log_dir}/{plan.run_id}" if options.log_dir else None
        self.stdout = console.wrap(options.stdout or sys.stdout, hint) or sys.stdout
        self.stderr = console.wrap(options.stderr or sys.stderr, hint) or sys.stderr
        self.log_errors: list[str] = []
        self._guardian_warned = False
        self.state = State.STARTING
        self.signal_received: int | None = None
        self.unkillable: list[int] = []
        self.warned_ranks: set[int] = set()
        self.wakeup_fd = -1
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._console_lines: dict[str, ConsoleLine] = {}  # per console stream: whose line is open
        # per attempt
        self.workers: list[_Worker] = []
        self.live: dict[int, _Worker] = {}
        self.streams: dict[int, WorkerStream] = {}
        self.failure: _Worker | None = None
        self.attempt_open = False
        self.killed = False
        self.gave_up = False
        self.forced_code: int | None = None  # from hooks.stop_code

    # ---- top level -------------------------------------------------------------------------------

    def run(self) -> JobResult:
        old_subreaper = self.os.set_child_subreaper(True)
        self.wakeup_fd = self.os.install_signals((*self.opt.forwarded_signals, signal.SIGCHLD))
        for fd in self.hooks.readers:
            self.os.watch_fd(fd)
        try:
            return self._run_attempts()
        finally:
            for fd in self.hooks.readers:
                self.os.unwatch_fd(fd)
            try:
                if self.attempt_open:  # an exception escaped (e.g. from a hook): still no orphan
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
            if self.hooks.before_attempt:
                self.hooks.before_attempt(attempt)
            results, root_cause = self._run_attempt(attempt)
            all_results.append(results)
            root_causes.append(root_cause)
            if self.hooks.after_attempt:
                self.hooks.after_attempt(attempt, results)
            succeeded = all(r.succeeded for r in results)
            restart = not succeeded and self.signal_received is None and attempt < self.opt.max_restarts
            restart = restart and self.forced_code is None
            if self.hooks.decide_restart is not None:
                restart = self.hooks.decide_restart(attempt, restart)
            if not restart:
                break
            self._backoff(attempt)
            if self.signal_received is not None:
                break
            attempt += 1
            self._console_err(
                f"openclaw-launch: attempt {attempt + 1}/{self.opt.max_restarts + 1} after {why_ended(root_cause)}"
            )
        self.state = State.DONE
        job = JobResult(
            exit_code=self._exit_code(root_cause, all_results[-1]),
            root_cause=root_cause,
            attempts=len(all_results),
            results=tuple(all_results),
            signal_received=self.signal_received,
            unkillable=tuple(self.unkillable),
            root_causes=tuple(root_causes),
            log_errors=tuple(self.log_errors),
            guardian_lost=self._guardian_lost(),
        )
        if self.opt.print_summary:
            self._print_summary(job)
        return job

    def _exit_code(self, root_cause: WorkerResult | None, last: tuple[WorkerResult, ...]) -> int:
        if self.forced_code is not None:
            return self.forced_code
        if root_cause is not None:
            return root_cause.code if root_cause.code is not None else 1
        if self.signal_received is not None:
            return 128 + self.signal_received
        return 0 if all(r.succeeded for r in last) else 1

    def _print_summary(self, job: JobResult) -> None:
        lines: list[str] = []
        if job.signal_received is not None:
            lines.append(
                f"openclaw-launch: received {signal_name(job.signal_received)}; "
                "forwarded it to the workers and stopped them"
            )
        if job.root_cause is not None:
            lines.append(f"openclaw-launch: job failed with exit code {job.exit_code}")
            lines.append(format_root_cause(job.root_cause, self.opt.error_files_kept))
        if job.unkillable:
            pids = ", ".join(map(str, job.unkillable))
            lines.append(
                f"openclaw-launch: gave up on pid(s) {pids}: still alive {self.opt.kill_timeout_s}s after "
                "SIGKILL (uninterruptible sleep, state D; check hung I/O or the GPU driver)"
            )
        if lines:
            self._console_err("\n".join(lines))

    def _console_err(self, text: str) -> None:
        try:
            self.stderr.write(text + "\n")
            self.stderr.flush()
        except (OSError, ValueError):
            pass

    # ---- one attempt -----------------------------------------------------------------------------

    def _run_attempt(self, attempt: int) -> tuple[tuple[WorkerResult, ...], WorkerResult | None]:
        self.workers, self.live, self.streams = [], {}, {}
        self.attempt_open = True
        self.failure, self.killed, self.gave_up = None, False, False
        logs = self._prepare_files(attempt)  # raises before any worker of the attempt starts
        for rank, rank_logs in zip(self.plan.ranks, logs, strict=True):
            if self.state is State.STARTING:
                self._spawn(rank, attempt, rank_logs)
            else:  # a spawn failed: do not start the rest
                _close_logs(rank_logs)
        if self.state is State.STARTING:
            self.state = State.RUNNING
            for interval_s, callback in (*((self.hooks.every,) if self.hooks.every else ()), *self.hooks.periodic):
                self._repeat(interval_s, callback)
        self._loop(lambda: (not self.live and not (self.hooks.hold and self.hooks.hold())) or self.gave_up)
        return self._finish_attempt()

    def _finish_attempt(self) -> tuple[tuple[WorkerResult, ...], WorkerResult | None]:
        """After the workers: kill leftovers, drain output, turn records into results."""
        self.state = State.STOPPING
        self.attempt_open = False
        if self.gave_up:
            self.unkillable.extend(self.live)
        self._kill_leftovers()
        self.live = {}
        self._timers = []
        for stream in list(self.streams.values()):
            self._drain(stream)
        if self.guardian is not None:
            for w in self.workers:
                if w.pid is not None and w.pid not in self.unkillable:
                    self.guardian.unwatch_pgid(w.pid)
        results: list[WorkerResult] = []
        root: WorkerResult | None = None
        for w in sorted(self.workers, key=lambda w: w.rank.local_rank):
            error_file = w.rank.env.get("TORCHELASTIC_ERROR_FILE")
            text = self.os.read_error_file(error_file) if error_file and w.failed else None
            result = w.result(error_file, read_error_file(text) if text else None)
            results.append(result)
            if w is self.failure:
                root = result
        return tuple(results), root

    def _prepare_files(self, attempt: int) -> list[dict[str, BinaryIO | None]]:
        """Every rank's log files and error-file directory, all or nothing."""
        opened: list[dict[str, BinaryIO | None]] = []
        try:
            for rank in self.plan.ranks:
                error_file = rank.env.get("TORCHELASTIC_ERROR_FILE")
                if error_file:  # a previous attempt's file must not be mistaken for this one's
                    try:
                        self.os.fresh_file(error_file)
                    except OSError as exc:
                        raise LaunchError(
                            f"cannot prepare the error file {error_file} for rank {rank.rank}: {exc}; "
                            "pass a writable --log-dir (error files live there), or set TMPDIR to a writable directory"
                        ) from exc
                opened.append(self._open_logs(rank, attempt))
        except BaseException:
            for logs in opened:
                _close_logs(logs)
            raise
        return opened

    def _spawn(self, rank: RankPlan, attempt: int, logs: dict[str, BinaryIO | None]) -> None:
        w = _Worker(
            rank,
            attempt,
            start_s=self.os.time(),
            mono_start_s=self.os.monotonic(),
            readbacks_left=self.opt.readback_attempts,
        )
        w.tail = deque(maxlen=self.opt.stderr_tail_lines)
        self.workers.append(w)
        try:
            spawned = self.os.spawn(rank.argv, {**rank.env, "TORCHELASTIC_RESTART_COUNT": str(attempt)})
        except OSError as exc:
            _close_logs(logs)
            w.finished, w.end_s, w.wall_s = True, self.os.time(), 0.0
            w.exit_code = 127 if isinstance(exc, FileNotFoundError) else 126
            w.tail.append(f"openclaw-launch: could not start {rank.argv[0]!r}: {exc}")
            self.failure = w
            if self.hooks.on_stopping:
                self.hooks.on_stopping(w.result(None, None), None)
            self._stop(signal.SIGTERM)
            return
        w.pid = spawned.pid
        self.live[w.pid] = w
        if self.guardian is not None:
            self.guardian.watch_pgid(w.pid)
        for fd, name in ((spawned.stdout_fd, "stdout"), (spawned.stderr_fd, "stderr")):
            if fd is not None:
                self._open_stream(w, fd, name, logs[name])
        self._at(self.opt.readback_delay_s, lambda: self._readback(w, self.opt.readback_delay_s))

    def _open_logs(self, rank: RankPlan, attempt: int) -> dict[str, BinaryIO | None]:
        logs: dict[str, BinaryIO | None] = {"stdout": None, "stderr": None}
        if not self.opt.log_dir:
            return logs
        base = f"{self.opt.log_dir}/{self.plan.run_id}/attempt-{attempt}/rank-{rank.rank}"
        try:
            for name in logs:
                logs[name] = self.os.open_log(f"{base}/{name}.log")
        except OSError as exc:
            _close_logs(logs)
            if attempt == 0:  # nothing started yet: say so now
                raise LaunchError(f"cannot write worker logs under {base}: {exc}; pass a writable --log-dir") from exc
            self._log_error(f"rank {rank.rank} attempt {attempt}", exc)  # a restart: the job goes on
            return {"stdout": None, "stderr": None}
        return logs

    def _log_error(self, what: str, exc: OSError) -> None:
        """A worker log cannot be written: warn once, keep the job and the console going, report it."""
        message = f"{what}: {exc.strerror or exc}"
        if not self.log_errors:
            self._console_err(
                f"openclaw-launch: warning: cannot write the worker log ({message}); the job goes on and the "
                "console still shows its output; further log errors are only in the report"
            )
        if len(self.log_errors) < 64:
            self.log_errors.append(message)

    def _open_stream(self, w: _Worker, fd: int, name: str, log: BinaryIO | None) -> None:
        r = w.rank
        show = self.opt.console_ranks is None or r.rank in self.opt.console_ranks
        show = show and not {(r.local_rank, name), (-1, name)} & self.opt.console_hidden  # --redirects
        prefix = self.opt.prefix_template.format(rank=r.rank, local_rank=r.local_rank, node=r.node, attempt=w.attempt)
        shown = (self.stdout if name == "stdout" else self.stderr) if show else None
        tail = w.tail if name == "stderr" else None
        line = self._console_lines.setdefault(name, ConsoleLine())
        label = f"rank {r.rank} {name} log"
        self.streams[fd] = WorkerStream(fd, prefix, shown, log, tail, line, lambda exc: self._log_error(label, exc))
        self.os.watch_fd(fd)

    # ---- event loop ------------------------------------------------------------------------------

    def _loop(self, done: Callable[[], bool]) -> None:
        while not done():
            self._step(self._next_timeout())

    def _step(self, timeout: float | None) -> None:
        for fd in self.os.wait_fds(timeout):
            if fd == self.wakeup_fd:
                for sig in self.os.drain_signals():
                    if sig != signal.SIGCHLD:
                        self._on_signal(sig)
            elif fd in self.streams:
                self._read(self.streams[fd])
            elif fd in self.hooks.readers:
                self.hooks.readers[fd]()
                if self.state is State.RUNNING and self.hooks.remote_stop and self.hooks.remote_stop():
                    self._stop(signal.SIGTERM)
        for reaped in self.os.reap():
            self._on_reaped(reaped)
        self._run_timers()
        if self.state is State.RUNNING and self.hooks.stop_code is not None:
            self.forced_code = self.hooks.stop_code()
            if self.forced_code is not None:
                self._stop(signal.SIGTERM)
        for stream in (self.stdout, self.stderr):
            if isinstance(stream, console.Console):
                stream.flush()

    def _at(self, delay: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (self.os.monotonic() + delay, next(self._seq), callback))

    def _repeat(self, interval_s: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` every ``interval_s`` while this attempt runs (its timers end with it)."""

        def tick() -> None:
            callback()
            if self.state is State.RUNNING:
                self._at(interval_s, tick)

        self._at(interval_s, tick)

    def _next_timeout(self) -> float | None:
        timeout = None if not self._timers else self._timers[0][0] - self.os.monotonic()
        if any(isinstance(c, console.Console) and c.pending for c in (self.stdout, self.stderr)):
            timeout = _CONSOLE_RETRY_S if timeout is None else min(timeout, _CONSOLE_RETRY_S)  # queued text
        return timeout

    def _run_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self.os.monotonic():
            heapq.heappop(self._timers)[2]()

    def _read(self, stream: WorkerStream) -> None:
        data = self.os.read_fd(stream.fd)
        if data is None:
            return
        if data:
            stream.feed(data)
        else:
            self._close_stream(stream)

    def _drain(self, stream: WorkerStream) -> None:
        """What is in the pipe now, without blocking (an unkillable process may still hold it) and
        bounded (a writer we could not kill, e.g. exempt, may keep it full)."""
        left = _MAX_DRAIN
        while left > 0 and (data := self.os.read_fd(stream.fd)):
            stream.feed(data)
            left -= len(data)
        self._close_stream(stream)

    def _close_stream(self, stream: WorkerStream) -> None:
        stream.finish()
        self.os.unwatch_fd(stream.fd)
        self.os.close_fd(stream.fd)
        del self.streams[stream.fd]

    # ---- transitions -----------------------------------------------------------------------------

    def _on_reaped(self, reaped: Reaped) -> None:
        w = self.live.pop(reaped.pid, None)
        if w is None:  # an orphan, a zombie (PID 1) or a daemon: collecting it was the point
            if self.guardian is not None and reaped.pid == self.guardian.pid:
                self.guardian.died(reaped.status)
                self._guardian_lost()
            return
        w.finished, w.end_s = True, self.os.time()
        w.wall_s = round(self.os.monotonic() - w.mono_start_s, 6)
        w.cpu_s, w.max_rss_kib = reaped.cpu_s, reaped.max_rss_kib
        code = os.waitstatus_to_exitcode(reaped.status)
        if code < 0:
            w.signal = -code
        else:
            w.exit_code = code
        if w.failed and self.state is State.RUNNING:
            self.failure = w
            if self.hooks.on_stopping:
                self.hooks.on_stopping(w.result(None, None), None)
            self._stop(signal.SIGTERM)

    def _on_signal(self, sig: int) -> None:
        if sig in self.opt.pass_signals:  # forwarded only (SIGUSR1 = checkpoint now): the job goes on
            if self.attempt_open:
                self._signal_groups(sig)
            return
        if self.signal_received is None:
            self.signal_received = sig
        if self.state is State.RUNNING:
            if self.hooks.on_stopping:
                self.hooks.on_stopping(None, sig)
            self._stop(sig)
        elif self.state is State.STOPPING:
            if sig in ESCALATING_SIGNALS:
                self._kill_groups()
            else:
                self._signal_groups(sig)
        # RESTARTING: no workers; the backoff loop sees signal_received and ends the job

    def _stop(self, sig: int) -> None:
        """Forward ``sig`` to every group, SIGKILL after the grace period."""
        self.state = State.STOPPING
        self._signal_groups(sig)
        self._at(self.opt.grace_period_s, self._kill_groups)

    def _signal_groups(self, sig: int) -> None:
        """Every worker's group that is still ours. A live (or unreaped) worker holds its group id;
        once it is reaped, the group is signalled only while one of our descendants is in it (its
        children may still run there), never a group id the kernel may have handed to a stranger."""
        ours: set[int] | None = None
        for w in self.workers:
            if w.pid is None:
                continue
            if w.pid not in self.live:
                if ours is None:
                    ours = self.os.descendant_groups(self._exempt())
                if w.pid not in ours:
                    continue
            self.os.killpg(w.pid, sig)

    def _kill_groups(self) -> None:
        if self.killed:
            return
        self.killed = True
        self._signal_groups(signal.SIGKILL)
        self._at(self.opt.kill_timeout_s, self._give_up)

    def _give_up(self) -> None:
        self.gave_up = True

    def _kill_leftovers(self) -> None:
        """SIGKILL what is left of the groups, then any descendant not exempt, and reap them (bounded)."""
        self._signal_groups(signal.SIGKILL)
        exempt = self._exempt()
        deadline = self.os.monotonic() + self.opt.kill_timeout_s
        while True:
            left = self.os.descendants(exempt)
            if not left:
                break
            if self.os.monotonic() >= deadline:
                self.unkillable.extend(left)
                break
            for pid in left:
                self.os.kill(pid, signal.SIGKILL)
            self._step(self.opt.cleanup_poll_s)

    def _exempt(self) -> set[int]:
        """Processes never killed as leftovers (with everything under them)."""
        exempt = set(self.unkillable)
        if self.guardian is not None:
            exempt.add(self.guardian.pid)
        if self.hooks.exempt_pids:
            exempt.update(self.hooks.exempt_pids())
        return exempt

    def _guardian_lost(self) -> str | None:
        if self.guardian is None:
            return None
        lost = self.guardian.lost
        if lost is not None and not self._guardian_warned:
            self._guardian_warned = True
            self._console_err(
                f"openclaw-launch: warning: the guardian is gone ({lost}): if this launcher is killed now, "
                "its workers' children are not cleaned up"
            )
        return lost

    def _backoff(self, attempt: int) -> None:
        self.state = State.RESTARTING
        delay = min(self.opt.restart_backoff_s * 2 ** min(attempt, 64), self.opt.restart_backoff_max_s)
        expired: list[bool] = []
        self._at(delay, lambda: expired.append(True))
        self._loop(lambda: bool(expired) or self.signal_received is not None)
        self._timers = []

    # ---- binding read-back -----------------------------------------------------------------------

    def _readback(self, w: _Worker, delay: float) -> None:
        if w.finished or w.pid is None:
            return
        uses_numactl = w.rank.argv[0].rsplit("/", 1)[-1] == "numactl"
        if uses_numactl and w.readbacks_left > 1 and self.os.proc_comm(w.pid) == "numactl":
            w.readbacks_left -= 1  # numactl has not exec'd the program yet
            self._at(delay * 2, lambda: self._readback(w, delay * 2))
            return
        status = self.os.proc_status(w.pid)
        if status is None:
            return
        w.bound_cpus = _parse_cpulist(status.get("Cpus_allowed_list", ""))
        w.bound_mems = _parse_cpulist(status.get("Mems_allowed_list", ""))
        planned = set(w.rank.cpus)
        if planned and w.bound_cpus is not None and set(w.bound_cpus) != planned:
            w.binding_warning = (
                f"rank {w.rank.rank} (pid {w.pid}) runs on CPUs {format_cpulist(w.bound_cpus)} but the "
                f"plan says {format_cpulist(planned)}: a cgroup or Slurm cpuset narrower than the plan, "
                "or numactl missing/failing"
            )
            if w.rank.rank not in self.warned_ranks:
                self.warned_ranks.add(w.rank.rank)
                self._console_err(f"openclaw-launch: warning: {w.binding_warning}")
