"""What a job and each of its workers came to, and how that is told to a user.

``WorkerResult`` and ``JobResult`` are what ``supervise`` returns (and the report, the error file
and the agents read); ``format_root_cause`` is the first thing shown when a job fails.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from openclaw_launch.safe_read import parse_json


@dataclass(frozen=True)
class WorkerResult:
    rank: int
    local_rank: int
    node: str
    attempt: int
    pid: int | None  # None when the spawn itself failed
    exit_code: int | None  # None when killed by a signal or never reaped
    signal: int | None
    start_s: float  # wall clock (time.time()), for the record
    end_s: float | None
    cpu_s: float | None
    max_rss_kib: int | None
    bound_cpus: tuple[int, ...] | None  # read back from /proc/PID/status
    bound_mems: tuple[int, ...] | None
    binding_warning: str | None
    stderr_tail: tuple[str, ...]
    error_file: str | None  # TORCHELASTIC_ERROR_FILE when the worker wrote it
    error: str | None  # its message and traceback
    wall_s: float | None = None  # run time on the monotonic clock (a clock step does not change it)

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0

    @property
    def code(self) -> int | None:
        """Exit code as a shell reports it: the code, or 128+signal."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    root_cause: WorkerResult | None
    attempts: int
    results: tuple[tuple[WorkerResult, ...], ...]  # per attempt, in rank order
    signal_received: int | None
    unkillable: tuple[int, ...]  # pids still alive after SIGKILL and kill_timeout_s
    root_causes: tuple[WorkerResult | None, ...] = ()  # per attempt (the last one is root_cause)
    log_errors: tuple[str, ...] = ()  # worker log files that could not be written (the job went on)
    guardian_lost: str | None = None  # the guardian died or stopped taking messages: why
    containment: str | None = None  # set by launch (cgroup.py); None: report.CONTAINMENT


def why_ended(cause: WorkerResult | None) -> str:
    """``rank 1 exited 3``: why an attempt ended, for the restart line."""
    if cause is None:
        return "a failure"
    if cause.signal is not None:
        return f"rank {cause.rank} was killed by {signal_name(cause.signal)}"
    return f"rank {cause.rank} exited {cause.exit_code}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def format_root_cause(result: WorkerResult, error_file_kept: bool = True) -> str:
    """What a user needs to see first: which rank, how it ended, its last words. The error file is
    named only when it outlives the job."""
    if result.signal is not None:
        how = f"was killed by {signal_name(result.signal)} (signal {result.signal}, exit code {result.code})"
    elif result.exit_code is not None:
        how = f"exited with code {result.exit_code}"
    else:
        how = "did not exit even after SIGKILL"
    lines = [
        f"root cause: rank {result.rank} (local rank {result.local_rank}) on node {result.node}, "
        f"pid {result.pid}, attempt {result.attempt}: {how}"
    ]
    if result.stderr_tail:
        lines.append(f"  last {len(result.stderr_tail)} line(s) of its stderr:")
        lines += [f"    {line}" for line in result.stderr_tail]
    if result.error:
        lines.append(f"  error file {result.error_file}:" if error_file_kept else "  its error file said:")
        lines += [f"    {line}" for line in result.error.splitlines()]
    return "\n".join(lines)


def read_error_file(text: str) -> str:
    """Message and traceback from torch's ``@record`` error file (or the raw text)."""
    try:
        data = parse_json(text)
    except ValueError:
        return text.strip()
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, str):
        return message
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        parts = [str(message.get("message") or ""), str(extra.get("py_callstack") or "")]
        return "\n".join(p.rstrip() for p in parts if p)
    return text.strip()


def format_summary(job: JobResult, kill_timeout_s: float, error_file_kept: bool) -> str:
    """The lines printed when the job ends: the signal received, the root cause, what would not die."""
    lines: list[str] = []
    if job.signal_received is not None:
        name = signal_name(job.signal_received)
        lines.append(f"openclaw-launch: received {name}; forwarded it to the workers and stopped them")
    if job.root_cause is not None:
        lines.append(f"openclaw-launch: job failed with exit code {job.exit_code}")
        lines.append(format_root_cause(job.root_cause, error_file_kept))
    if job.unkillable:
        pids = ", ".join(map(str, job.unkillable))
        lines.append(
            f"openclaw-launch: gave up on pid(s) {pids}: still alive {kill_timeout_s}s after "
            "SIGKILL (uninterruptible sleep, state D; check hung I/O or the GPU driver)"
        )
    return "\n".join(lines)
