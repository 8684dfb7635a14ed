"""The effects of a run, in order: private run directory, guardian, MPS daemon, supervision, report.

Everything here is undone on every path (success, failure, signal, exception), and the guardian
undoes it if the launcher itself is SIGKILLed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from openclaw_launch.guard import Guardian
from openclaw_launch.osproc import RealOs
from openclaw_launch.plan import LaunchPlan
from openclaw_launch.report import build_report, format_report, write_report
from openclaw_launch.supervise import SuperviseHooks, SuperviseOptions, supervise

if TYPE_CHECKING:
    from openclaw_launch.mps import MpsDaemon


def run_dir_for(run_id: str) -> Path:
    """Where this launcher keeps error files and MPS pipes: unique per launcher, known before it exists."""
    return Path(tempfile.gettempdir()) / f"openclaw-{run_id}-{os.getpid()}"


def with_env(plan: LaunchPlan, extra: dict[str, str]) -> LaunchPlan:
    ranks = tuple(dataclasses.replace(r, env={**r.env, **extra}) for r in plan.ranks)
    return dataclasses.replace(plan, ranks=ranks)


def launch(plan: LaunchPlan, options: SuperviseOptions, report_path: str | None = None) -> int:
    """Run the plan; return the launcher's exit code."""
    run_dir = run_dir_for(plan.run_id)
    run_dir.mkdir(mode=0o700)
    # Subreaper before MPS starts: `nvidia-cuda-mps-control -d` double-forks, and an orphan handed to
    # an init that never reaps stays <defunct> (seen on the H200 host). Ours are reaped below.
    os_layer = RealOs()
    os_layer.set_child_subreaper(True)
    guardian = Guardian.start()
    guardian.watch_path(str(run_dir))
    daemon: MpsDaemon | None = None
    try:
        if plan.mps is not None:  # psutil and the MPS module load only for MPS jobs
            from openclaw_launch.mps import start_mps

            daemon, warning = start_mps(plan, run_dir=run_dir / "mps")
            if warning:
                print(f"openclaw-launch: warning: {warning}", file=sys.stderr)
        if daemon is not None:
            argv, env, stdin = daemon.cleanup_command()
            guardian.watch_command(argv, env, stdin)
            plan = with_env(plan, daemon.worker_env())
        # The daemon may be our descendant (we are a child subreaper): spare it from leftover kills.
        exempt = [daemon.pid] if daemon is not None and daemon.pid is not None else []
        hooks = SuperviseHooks(exempt_pids=lambda: exempt)
        result = supervise(plan, options, os_layer, hooks, guardian=guardian)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        guardian.close()
        os_layer.reap()
    report = build_report(plan, result)
    if report_path:
        write_report(report_path, report)
    if result.exit_code != 0 or report_path:
        print(format_report(report), file=sys.stderr)
    return result.exit_code
