"""What the supervisor keeps per worker of an attempt, the binding read back from /proc, and the
per-attempt files (log files, fresh error files) prepared before any worker of it starts.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from openclaw_launch import exit_codes
from openclaw_launch.errors import LaunchError
from openclaw_launch.plan.context import LogDir
from openclaw_launch.run.failure_class import Evidence
from openclaw_launch.run.osproc import OsLayer, Reaped
from openclaw_launch.run.results import WorkerResult, read_error_file
from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist

if TYPE_CHECKING:  # plan.py pulls in config/yaml; the supervisor only needs the shapes
    from openclaw_launch.plan.model import RankPlan

Logs = dict[str, BinaryIO | None]  # "stdout"/"stderr" -> the rank's log file of this attempt
_MAX_LOG_ERRORS = 64  # kept for the report; the console is told once


@dataclass
class WorkerRecord:
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

    def evidence(self, read_file: Callable[[str], str | None]) -> Evidence:
        """What classifies its failure (run/failure_class.py): how it ended, its error file, its last stderr lines."""
        path = self.rank.env.get("TORCHELASTIC_ERROR_FILE")
        return Evidence(
            exit_code=self.exit_code,
            signal=self.signal,
            error_file=read_file(path) if path else None,
            stderr_tail=tuple(self.tail),
            not_started=self.pid is None,
        )

    def ended(self, reaped: Reaped, now_s: float, monotonic_s: float) -> None:
        self.finished, self.end_s = True, now_s
        self.wall_s = round(monotonic_s - self.mono_start_s, 6)
        self.cpu_s, self.max_rss_kib = reaped.cpu_s, reaped.max_rss_kib
        code = os.waitstatus_to_exitcode(reaped.status)
        if code < 0:
            self.signal = -code
        else:
            self.exit_code = code

    def not_started(self, exc: OSError, now_s: float) -> None:
        """The spawn failed: 127 (not found) or 126 (not executable), as a shell says."""
        self.finished, self.end_s, self.wall_s = True, now_s, 0.0
        self.exit_code = exit_codes.NOT_FOUND if isinstance(exc, FileNotFoundError) else exit_codes.NOT_EXECUTABLE
        self.tail.append(f"openclaw-launch: could not start {self.rank.argv[0]!r}: {exc}")

    def still_numactl(self, proc_comm: Callable[[int], str | None]) -> bool:
        """numactl has not exec'd the program yet: the binding in force is not the program's."""
        uses_numactl = self.rank.argv[0].rsplit("/", 1)[-1] == "numactl"
        return uses_numactl and self.readbacks_left > 1 and self.pid is not None and proc_comm(self.pid) == "numactl"

    def read_binding(self, status: Mapping[str, str]) -> str | None:
        """Record the CPUs and memory nodes in force; a warning when the CPUs are not the plan's."""
        self.bound_cpus = _parse_cpulist(status.get("Cpus_allowed_list", ""))
        self.bound_mems = _parse_cpulist(status.get("Mems_allowed_list", ""))
        planned = set(self.rank.cpus)
        if planned and self.bound_cpus is not None and set(self.bound_cpus) != planned:
            self.binding_warning = (
                f"rank {self.rank.rank} (pid {self.pid}) runs on CPUs {format_cpulist(self.bound_cpus)} but the "
                f"plan says {format_cpulist(planned)}: a cgroup or Slurm cpuset narrower than the plan, "
                "or numactl missing/failing"
            )
        return self.binding_warning


def attempt_results(
    workers: Sequence[WorkerRecord], failure: WorkerRecord | None, read_file: Callable[[str], str | None]
) -> tuple[tuple[WorkerResult, ...], WorkerResult | None]:
    """The attempt's results in local-rank order (a failed worker's error file read), and the root cause's."""
    results: list[WorkerResult] = []
    root: WorkerResult | None = None
    for w in sorted(workers, key=lambda w: w.rank.local_rank):
        error_file = w.rank.env.get("TORCHELASTIC_ERROR_FILE")
        text = read_file(error_file) if error_file and w.failed else None
        result = w.result(error_file, read_error_file(text) if text else None)
        results.append(result)
        if w is failure:
            root = result
    return tuple(results), root


def read_back(
    w: WorkerRecord,
    os_layer: OsLayer,
    at: Callable[[float, Callable[[], None]], None],
    delay_s: float,
    warn: Callable[[WorkerRecord, str], None],
) -> None:
    """In ``delay_s``: the binding in force from /proc/PID/status (again, twice as late, while the
    worker is still numactl); ``warn`` when it is not the plan's."""

    def read() -> None:
        if w.finished or w.pid is None:
            return
        if w.still_numactl(os_layer.proc_comm):
            w.readbacks_left -= 1
            read_back(w, os_layer, at, delay_s * 2, warn)
            return
        status = os_layer.proc_status(w.pid)
        warning = w.read_binding(status) if status is not None else None
        if warning:
            warn(w, warning)

    at(delay_s, read)


def _parse_cpulist(text: str) -> tuple[int, ...] | None:
    try:
        return parse_cpulist(text)
    except ValueError:
        return None


def close_logs(logs: Logs) -> None:
    for log in logs.values():
        if log is not None:
            log.close()


class AttemptFiles:
    """Each rank's log files (``LogDir.rank_log``: ``<log_dir>/<run_id>/attempt-<n>/rank-<r>/``) and
    fresh error file. A log that cannot be written stops nothing once the job runs: the console is
    warned once and the report lists it (``log_errors``)."""

    def __init__(self, os_layer: OsLayer, log_dir: str | None, run_id: str, warn: Callable[[str], None]) -> None:
        self.os = os_layer
        self.logs = LogDir.of(log_dir, run_id) if log_dir else None
        self._warn = warn
        self.log_errors: list[str] = []

    def prepare(self, ranks: tuple[RankPlan, ...], attempt: int) -> list[Logs]:
        """Every rank's files of the attempt, all or nothing (raises before any worker starts)."""
        opened: list[Logs] = []
        try:
            for rank in ranks:
                error_file = rank.env.get("TORCHELASTIC_ERROR_FILE")
                if error_file:  # a previous attempt's file must not be mistaken for this one's
                    try:
                        self.os.fresh_file(error_file)
                    except OSError as exc:
                        raise LaunchError(
                            f"cannot prepare the error file {error_file} for rank {rank.rank}: {exc}; "
                            "pass a writable --log-dir (error files live there), or set TMPDIR to a writable directory"
                        ) from exc
                opened.append(self._open(rank, attempt))
        except BaseException:
            for logs in opened:
                close_logs(logs)
            raise
        return opened

    def _open(self, rank: RankPlan, attempt: int) -> Logs:
        logs: Logs = {"stdout": None, "stderr": None}
        if self.logs is None:
            return logs
        base = self.logs.rank_dir(rank.rank, attempt)
        try:
            for name in logs:
                logs[name] = self.os.open_log(str(self.logs.rank_log(rank.rank, attempt, name)))
        except OSError as exc:
            close_logs(logs)
            if attempt == 0:  # nothing started yet: say so now
                raise LaunchError(f"cannot write worker logs under {base}: {exc}; pass a writable --log-dir") from exc
            self.log_error(f"rank {rank.rank} attempt {attempt}", exc)  # a restart: the job goes on
            return {"stdout": None, "stderr": None}
        return logs

    def log_error(self, what: str, exc: OSError) -> None:
        """A worker log cannot be written: warn once, keep the job and the console going, report it."""
        message = f"{what}: {exc.strerror or exc}"
        if not self.log_errors:
            self._warn(
                f"openclaw-launch: warning: cannot write the worker log ({message}); the job goes on and the "
                "console still shows its output; further log errors are only in the report"
            )
        if len(self.log_errors) < _MAX_LOG_ERRORS:
            self.log_errors.append(message)
