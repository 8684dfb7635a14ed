"""What a run sets up and undoes around supervision, on this node: the open-files limit, the private
run directory, the job's cgroup v2, the MPS daemon (each registered with the guardian before it
exists), the participants that keep the last two per attempt, and the stopping signals that arrive
outside supervision (before the first worker, while cleaning up). ``job/launch.py`` calls them in
order; everything here is undone on every path."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from openclaw_launch.errors import LaunchError
from openclaw_launch.limits import FD_MARGIN, FDS_PER_RANK, FDS_PER_RANK_LOGS
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run import cgroup
from openclaw_launch.run.guard import Guardian
from openclaw_launch.run.osproc import RealOs
from openclaw_launch.run.participant import Participant
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, signal_name

if TYPE_CHECKING:
    from openclaw_launch.run.mps.daemon import MpsDaemon
    from openclaw_launch.run.prewarm import Zygote


def open_files_for(local_ranks: int, with_logs: bool) -> None:
    """Raise the open-files soft limit to what the workers' pipes (and logs) need, up to the hard
    limit; refuse up front when the hard limit is lower (the common soft limit of 1024 ends a job
    of 500 ranks at spawn otherwise). The workers inherit the raised soft limit."""
    import resource

    need = local_ranks * (FDS_PER_RANK + (FDS_PER_RANK_LOGS if with_logs else 0)) + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise LaunchError(
            f"{local_ranks} local ranks need about {need} open files, but the hard limit is {hard} (ulimit -Hn): "
            f"raise it to {need} (ulimit -n {need} as root, LimitNOFILE={need} for a systemd unit, "
            f"docker run --ulimit nofile={need}), or start fewer ranks on this node"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def job_cgroup_for(
    plan: LaunchPlan, guardian: Guardian, os_layer: RealOs, undo: contextlib.ExitStack
) -> cgroup.JobCgroup | None:
    """The per-job cgroup v2 the workers join (cgroup.py), where the host allows one: killed and
    removed at the end, or by the guardian if the launcher is SIGKILLed. None: the job runs with
    process groups, subreaper and guardian only."""
    job = cgroup.create(f"openclaw-{plan.run_id}-{os.getpid()}")
    if job is None:
        return None
    guardian.watch_cgroup(job.path)
    undo.callback(job.remove)
    os_layer.cgroup_procs = job.procs
    undo.callback(setattr, os_layer, "cgroup_procs", None)
    return job


def start_zygote(
    plan: LaunchPlan,
    os_layer: RealOs,
    undo: contextlib.ExitStack,
    options: SuperviseOptions,
    early: Zygote | None = None,
) -> None:
    """``--prewarm``: the zygote that forks the workers (run/prewarm.py), started now so that its
    imports run while the launcher sets up the rest; closed (and collected) at the end. ``early``: one
    an elastic launcher started before it waited for its world (cli/run.py), used if it is the plan's."""
    if early is not None and early.prewarm != plan.prewarm:
        early.close()
        early = None
    if plan.prewarm is None:
        return
    from openclaw_launch.run.prewarm import Zygote, zygote_env

    if early is not None:
        zygote = early
    else:
        env = zygote_env(os.environ, [rank.env for rank in plan.ranks])
        zygote = Zygote.start(plan.prewarm, env, lambda line: say(options, line))
    undo.callback(zygote.close)
    os_layer.zygote = zygote
    undo.callback(setattr, os_layer, "zygote", None)


class MpsParticipant(Participant):
    """The MPS daemon lives for the whole job (restarts keep it); it may be our descendant (we are a
    child subreaper): never killed as a leftover. Nothing per attempt."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def exempt_pids(self) -> list[int]:
        return [self.pid]


class CgroupParticipant(Participant):
    """After each attempt's own kills, the job cgroup is cleared of what escaped the workers' groups."""

    def __init__(self, job: cgroup.JobCgroup) -> None:
        self.job = job

    def end_attempt(self, attempt: int) -> None:
        self.job.clear()


def make_run_dir(run_dir: Path) -> Path:
    try:
        run_dir.mkdir(mode=0o700)
    except FileExistsError:
        raise LaunchError(
            f"the run directory {run_dir} already exists: another launcher with this run id and pid "
            "(a container's PID 1 sharing /tmp?) or one that was SIGKILLed with its guardian. Remove "
            "it, or pass another --run-id"
        ) from None
    except OSError as e:
        raise LaunchError(f"cannot create the run directory {run_dir}: {e}; set TMPDIR to a writable directory") from e
    return run_dir


def start_mps(plan: LaunchPlan, guardian: Guardian, options: SuperviseOptions) -> MpsDaemon | None:
    """Start the plan's daemon, registered with the guardian before it exists (a SIGKILLed launcher
    must not leave it running)."""
    from openclaw_launch.run.mps.daemon import start_mps  # psutil and the MPS module load only for MPS jobs

    watched: list[int] = []
    daemon, warning = start_mps(
        plan, run_dir=Path(plan.run_dir.mps_dir), on_launch=lambda cmd: watched.append(guardian.watch_command(*cmd))
    )
    if daemon is None:
        for command_id in watched:
            guardian.unwatch_command(command_id)
    if warning:
        say(options, f"openclaw-launch: warning: {warning}")
    return daemon


def forwarded(signals: list[int], options: SuperviseOptions) -> list[int]:
    """The stopping signals among ``signals`` (a forwarded-only one with no worker running is dropped)."""
    return [s for s in signals if s in options.forwarded_signals and s not in options.pass_signals]


def not_started(sig: int, options: SuperviseOptions) -> JobResult:
    say(options, f"openclaw-launch: received {signal_name(sig)} before the workers started; started none")
    return JobResult(exit_code=128 + sig, root_cause=None, attempts=0, results=(), signal_received=sig, unkillable=())


def with_late_signal(result: JobResult, late: list[int], options: SuperviseOptions) -> JobResult:
    """A signal after the workers were gone (MPS stop, cleanup) counts as one received during the
    job: a root cause keeps its exit code, otherwise it is 128+signal."""
    if not late or result.signal_received is not None:
        return result
    sig = late[0]
    say(options, f"openclaw-launch: received {signal_name(sig)} while cleaning up after the workers")
    code = result.exit_code if result.root_cause is not None else 128 + sig
    return dataclasses.replace(result, exit_code=code, signal_received=sig)


def say(options: SuperviseOptions, text: str) -> None:
    stream = options.stderr or sys.stderr
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):  # console gone: the exit code and report still tell
        pass
