"""The statistics side of a run: what ``launch`` starts when the plan has a telemetry socket.

The session (inbox, collector, NVML sampler) with its live parts (hang monitor, metrics endpoint,
stats file), as the supervision participants that feed it; the ranks' variables for it are the plan's
(plan/env.py). Heavy modules (NVML, prometheus-client) load only when asked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from openclaw_launch.config import defaults
from openclaw_launch.plan.context import LogDir
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run.participant import Participant
from openclaw_launch.run.results import JobResult
from openclaw_launch.run.supervise import SuperviseOptions

if TYPE_CHECKING:
    from openclaw_launch.stats.job_live import JobLiveTarget
    from openclaw_launch.stats.judged import Judged
    from openclaw_launch.stats.session import StatsSession


@dataclass(frozen=True)
class StatsOptions:
    """Per-step statistics and the straggler verdict (on when the plan has a telemetry socket)."""

    interval_s: float | None = defaults.STATS_INTERVAL_S  # the live one-line summary; 0 = none; None = the cadence
    threshold_pct: float = defaults.STRAGGLER_THRESHOLD_PCT  # a straggler slows the step this much
    sample_gpus: bool = True  # NVML sampling of the plan's GPUs
    hang_timeout_s: float | None = None  # --hang-timeout-s (openclaw_launch/stats/hang.py); None = off
    startup_timeout_s: float | None = None  # --startup-timeout-s, resolved (defaults.startup_timeout_s)
    metrics_port: int | None = None  # --metrics-port (openclaw_launch/stats/metrics.py); 0 = any free port
    stats_file: str | None = None  # --stats-file: JSON lines, one per interval
    job_live: JobLiveTarget | None = None  # several nodes: the agents' store for the job's live verdict (job/agents.py)
    job_line: bool = True  # node 0 prints the job's live line (--on-straggler none: it does not)
    on_judged: Callable[[Judged], None] | None = None  # node 0: each interval's verdict (the straggler policy)


def start_statistics(
    plan: LaunchPlan,
    socket_path: str,
    stats: StatsOptions,
    options: SuperviseOptions,
    say: Callable[[str], None],
) -> StatsSession:
    """The session reading ``socket_path`` (its caller closes it)."""
    session = _start_stats(plan, socket_path, stats, say)
    _start_live(session, stats, options, say)
    return session


def statistics_participants(session: StatsSession) -> list[Participant]:
    """What takes part in supervision for statistics: the session, and its hang watch if on."""
    return [session] if session.hang is None else [session, session.hang]


def binding_warnings(result: JobResult) -> dict[int, str]:
    last = result.results[-1] if result.results else ()
    return {w.rank: w.binding_warning for w in last if w.binding_warning}


def _start_live(
    session: StatsSession, stats: StatsOptions, options: SuperviseOptions, say: Callable[[str], None]
) -> None:
    """Hang detection on the session (which closes it); the metrics endpoint announced (the session
    bound it, its helper serves it)."""
    plan = session.plan
    if stats.hang_timeout_s:
        from openclaw_launch.stats.hang import HangWatch
        from openclaw_launch.stats.hang_monitor import HangMonitor, stack_files, watched

        logs = LogDir.of(options.log_dir, plan.run_id) if options.log_dir else None

        def log_path(rank: int, attempt: int) -> str | None:
            return str(logs.rank_log(rank, attempt, "stderr")) if logs is not None else None

        watch = HangWatch(stats.hang_timeout_s, watched(plan.ranks), stats.startup_timeout_s)
        session.hang = HangMonitor(watch, say, stack_files(plan.ranks), log_path)
    if session.metrics_port is not None:  # bound by the session, served by its helper
        session.publish()
        say(f"openclaw-launch: metrics on http://0.0.0.0:{session.metrics_port}/metrics")


def _start_stats(plan: LaunchPlan, socket_path: str, stats: StatsOptions, say: Callable[[str], None]) -> StatsSession:
    from openclaw_launch.stats.session import StatsSession

    gpu_source = None
    if stats.sample_gpus:
        from openclaw_launch.run.gpu_memory import NVML_RECORDING_ENV
        from openclaw_launch.stats.gpu import PynvmlSource, RecordedSource

        recording = os.environ.get(NVML_RECORDING_ENV)  # tests: a real GPU's samples and events, replayed
        gpu_source = (lambda _uuids: RecordedSource.load(Path(recording))) if recording else PynvmlSource
    return StatsSession(
        plan,
        socket_path,
        stats.threshold_pct,
        say,
        gpu_source,
        stats.metrics_port,
        stats.stats_file,
        stats.interval_s,
        stats.job_live,
        stats.job_line,
        stats.on_judged,
    )
