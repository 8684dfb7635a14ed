"""The effects of a run, in order: private run directory, guardian, MPS daemon, supervision, report.

Everything here is undone on every path (success, failure, signal, exception), and the guardian
undoes it if the launcher itself is SIGKILLed. The forwarded signals are caught for the whole run,
not only while ``supervise`` runs: one that arrives while the MPS daemon starts means no worker
starts, one that arrives while it stops still makes the exit code 128+signal, and neither kills
the launcher halfway through its cleanup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_launch.config.limits import FD_MARGIN, FDS_PER_RANK, FDS_PER_RANK_LOGS
from openclaw_launch.errors import LaunchError
from openclaw_launch.files import write_atomic
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run import cgroup, console
from openclaw_launch.run.errorfile import write_parent_error_file
from openclaw_launch.run.failure_policy import FailurePolicy
from openclaw_launch.run.guard import Guardian
from openclaw_launch.run.osproc import RealOs
from openclaw_launch.run.participant import Participant
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, signal_name, supervise
from openclaw_launch.stats.wiring import StatsOptions, binding_warnings, start_statistics, statistics_participants

if TYPE_CHECKING:
    from collections.abc import Callable

    from openclaw_launch.agents.fate import Agent, AgentOptions
    from openclaw_launch.agents.store_loop import StoreLink
    from openclaw_launch.report.model import NodeReport, PreflightVerdict
    from openclaw_launch.run.failure_class import Failure
    from openclaw_launch.run.mps.daemon import MpsDaemon
    from openclaw_launch.stats.session import StatsSession


_FINAL_DRAIN_S = 5.0  # at exit, the console gets this long to take what is queued


@dataclass(frozen=True)
class AgentSetup:
    """A multi-node job's agent: where the agents meet, and what this node must agree on."""

    options: AgentOptions
    fingerprint: dict[str, str]
    job_report_path: str | None = None  # the first node writes the job's report here
    link: StoreLink | None = None  # node ranks by arrival: the helper that took this node's rank
    make_agent: Callable[[Callable[[str], None]], Agent] | None = None  # elastic: agents/elastic_agent.py's


def launch(
    plan: LaunchPlan,
    options: SuperviseOptions,
    report_path: str | None = None,
    parent_error_file: str | None = None,
    stats: StatsOptions | None = None,
    agents: AgentSetup | None = None,
    preflight: Callable[[int], PreflightVerdict] | None = None,
    exit_code_classes: bool = False,
) -> int:
    """Run the plan; return the launcher's exit code. ``parent_error_file``: the launcher's own
    TORCHELASTIC_ERROR_FILE, which receives a failed job's root cause as torchrun writes it.
    ``agents``: a multi-node job (openclaw_launch/agents): meet the other nodes first, share their fate.
    ``preflight``: judges the workers' measurements once they ended (given the exit code); its verdict
    goes into the report. ``exit_code_classes``: a failed job exits 70 or 75 by its failure class
    (run/exit_codes.py), not with the worker's code."""
    hint = f"{options.log_dir}/{plan.run_id}" if options.log_dir else None
    out, err = console.wrap(options.stdout or sys.stdout, hint), console.wrap(options.stderr or sys.stderr, hint)
    options = dataclasses.replace(options, stdout=out, stderr=err)  # never blocks supervision
    os_layer = RealOs()
    _open_files_for(len(plan.ranks), bool(options.log_dir))
    os_layer.install_signals((*options.forwarded_signals, *options.pass_signals))
    agent: Agent | None = None
    try:
        if agents is not None:
            from openclaw_launch.agents.fate import Agent

            say = functools.partial(_say, options)
            agent = agents.make_agent(say) if agents.make_agent else Agent(plan, agents.options, say, agents.link)
            early = agent.join(
                agents.fingerprint, lambda: next(iter(_forwarded(os_layer.drain_signals(), options)), None)
            )
            if early is not None:
                return _not_started(early, options).exit_code
            agent.start()
        result, statistics, failures = _run(
            plan, options, os_layer, parent_error_file, stats or StatsOptions(), agent, exit_code_classes
        )
        result = _with_late_signal(result, _forwarded(os_layer.drain_signals(), options), options)
        dropped = console.dropped_lines(out) + console.dropped_lines(err)
        code = result.exit_code  # with agents: the job's fate, the same on every node (supervise.py)
        verdict = preflight(code) if preflight is not None else None
        from openclaw_launch.report.build import build_report, write_report  # after the job: start-up time
        from openclaw_launch.report.format import format_report

        report = build_report(
            agent.plan if agent is not None else plan,  # an elastic job's: its last world's
            result,
            statistics,
            code,
            console_dropped_lines=dropped,
            preflight=verdict,
            failures=failures,
        )
        if agents is not None and agents.make_agent is not None:
            from openclaw_launch.agents.elastic_agent import with_memberships

            report = with_memberships(report, agent)
        if report_path:
            try:
                write_report(report_path, report)
            except OSError as e:  # the job's outcome stands: its exit code is not the report's
                _say(options, _unwritten("report", report_path, e, code))
        if result.attempts:  # per-rank outcome, time, resources and binding in force, on every exit
            _say(options, format_report(report))
        if agent is not None and agents is not None:
            code = _job_report(agent, agents, report, statistics, code, options)
        return code
    finally:
        if agent is not None:
            agent.close()
        os_layer.restore_signals()
        for c in (out, err):  # what the console still holds, for a bounded time: then we exit anyway
            if isinstance(c, console.Console):
                c.drain(_FINAL_DRAIN_S)


def _job_report(
    agent: Agent,
    agents: AgentSetup,
    report: NodeReport,
    statistics: dict[str, Any] | None,
    code: int,
    options: SuperviseOptions,
) -> int:
    """Every node sends its report to the first node, which prints and writes the job's."""
    from openclaw_launch.agents.merge import NodePayload, merge_reports, node_payload
    from openclaw_launch.report.build import write_report
    from openclaw_launch.report.codec import ReportShapeError, from_json, to_json
    from openclaw_launch.report.format import format_report

    own = node_payload(report, statistics)
    sent = agent.finish(to_json(own))
    if sent is None:
        return code
    payloads = [own]  # this node's own, as built: the job report never lacks the first node
    for data in sent[1:]:
        try:
            payloads.append(from_json(NodePayload, data))
        except ReportShapeError as e:  # another version of openclaw-launch: that node counts as missing
            _say(options, f"openclaw-launch: warning: a node's report could not be read: {e}")
    fates = {attempt: fate.node for attempt, fate in agent.fates.items()}
    job = merge_reports(payloads, agent.opt.nodes, code, fates)  # elastic: the last world's
    if job.missing_nodes:
        _say(options, f"openclaw-launch: warning: no report from node(s) {', '.join(job.missing_nodes)}")
    _say(options, "job report (every node):\n" + format_report(job))
    if agents.job_report_path:
        try:
            write_report(agents.job_report_path, job)
        except OSError as e:
            _say(options, _unwritten("job report", agents.job_report_path, e, code))
    return code


def _unwritten(what: str, path: str, error: OSError, code: int) -> str:
    return (
        f"openclaw-launch: error: cannot write the {what} {path}: {error.strerror or error}; "
        f"the job's exit code {code} stands"
    )


def _open_files_for(local_ranks: int, with_logs: bool) -> None:
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


def _run(
    plan: LaunchPlan,
    options: SuperviseOptions,
    os_layer: RealOs,
    parent_error_file: str | None,
    stats: StatsOptions,
    agent: Agent | None = None,
    exit_code_classes: bool = False,
) -> tuple[JobResult, dict[str, Any] | None, dict[int, Failure]]:
    """Set everything up, supervise, tear everything down (in reverse order, whatever happens).
    Returns the job's result, its statistics and each attempt's classified failure."""
    run_dir = _make_run_dir(Path(plan.run_dir.path))  # the plan's paths (plan/context.py); it adds nothing to a rank
    session: StatsSession | None = None
    with contextlib.ExitStack() as undo:
        # Subreaper before MPS starts: `nvidia-cuda-mps-control -d` double-forks, and an orphan handed
        # to an init that never reaps stays <defunct> (seen on the H200 host). Ours are reaped here.
        undo.callback(os_layer.set_child_subreaper, os_layer.set_child_subreaper(True))
        undo.callback(os_layer.reap)
        undo.callback(shutil.rmtree, run_dir, ignore_errors=True)
        guardian = Guardian.start()
        undo.callback(guardian.close)
        guardian.watch_path(str(run_dir))
        job_cgroup = _job_cgroup(plan, guardian, os_layer, undo)
        if plan.parallel is not None:  # the groups file OPENCLAW_PARALLEL_FILE names (parallel.py)
            write_atomic(plan.run_dir.parallel_file, json.dumps(plan.parallel.to_json()))
        daemon = _start_mps(plan, guardian, options) if plan.mps is not None else None
        if daemon is not None:
            undo.callback(daemon.stop)
        if plan.telemetry_socket is not None:
            say = functools.partial(_say, options)
            session = start_statistics(plan, plan.telemetry_socket, stats, options, say)
            undo.callback(session.close)
        elif stats.hang_timeout_s or stats.metrics_port is not None or stats.stats_file:
            _say(
                options,
                "openclaw-launch: warning: --telemetry off: no progress from the workers, so "
                "--hang-timeout-s, --metrics-port and --stats-file are off",
            )
        early = _forwarded(os_layer.drain_signals(), options)
        policy = _failure_policy(plan, options, session, job_cgroup)
        if early:  # e.g. Ctrl-C while the MPS daemon started: start no worker at all
            result = _not_started(early[0], options)
        else:
            participants: list[Participant] = [_ReportModules(len(plan.ranks)), policy]
            if daemon is not None and daemon.pid is not None:
                participants.append(_MpsParticipant(daemon.pid))
            if job_cgroup is not None:
                participants.append(_CgroupParticipant(job_cgroup))
            if session is not None:
                participants += statistics_participants(session)
            if agent is not None:
                participants.append(agent)
            result = supervise(plan, options, os_layer, participants, guardian=guardian)
        from openclaw_launch.report.build import CONTAINMENT  # the report's types load after the spawn

        joined = job_cgroup if job_cgroup is not None and job_cgroup.joinable() else None  # probed beside the spawn
        containment = f"cgroup2:{joined.path}+{CONTAINMENT}" if joined is not None else CONTAINMENT
        result = dataclasses.replace(result, containment=containment)
        if exit_code_classes:  # 70 / 75 by the last attempt's failure class (docs/failures.md)
            code = policy.exit_code(result.exit_code, result.attempts, result.signal_received)
            result = dataclasses.replace(result, exit_code=code)
        if parent_error_file and result.exit_code != 0:  # before the workers' files go with run_dir
            write_parent_error_file(parent_error_file, result, lambda msg: _say(options, msg))
        statistics = session.finish(binding_warnings(result)) if session is not None else None
    return result, statistics, policy.failures


def _failure_policy(
    plan: LaunchPlan, options: SuperviseOptions, session: StatsSession | None, job_cgroup: cgroup.JobCgroup | None
) -> FailurePolicy:
    """Classification and the restart-storm rule, with the evidence this node has: each rank's steps
    and the GPUs' NVML events (statistics), the OOM kills of the job's cgroup (or the launcher's own)."""
    dirs = (job_cgroup.path if job_cgroup is not None else None, cgroup.own_dir())
    oom_dir = next((d for d in dirs if d is not None and cgroup.oom_kills(d) is not None), None)
    return FailurePolicy(
        {r.rank: r.gpu_uuid for r in plan.ranks},
        options.max_restarts,
        functools.partial(_say, options),
        steps_of=session.steps_of if session is not None else None,
        oom_kills=functools.partial(cgroup.oom_kills, oom_dir) if oom_dir is not None else None,
        gpu_events=session.gpu_events if session is not None else None,
    )


def _job_cgroup(
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


class _MpsParticipant(Participant):
    """The MPS daemon lives for the whole job (restarts keep it); it may be our descendant (we are a
    child subreaper): never killed as a leftover. Nothing per attempt."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def exempt_pids(self) -> list[int]:
        return [self.pid]


class _ReportModules(Participant):
    """Loads the report's modules (~20 frozen types, the verdict: ~25 ms of CPU) right after this
    node's last worker is spawned, while the workers start, where a CPU is left over for it (more
    usable CPUs than local ranks): then neither the start nor the clean exit waits for them. With no
    CPU to spare that import would delay the workers' start (2-core box: 25-30 ms at N=4 and 8), and
    it happens at the end instead."""

    def __init__(self, local_ranks: int) -> None:
        self.spawns_left = local_ranks if len(os.sched_getaffinity(0)) > local_ranks else None

    def on_spawn(self, rank: int, pid: int) -> None:
        if self.spawns_left is None:
            return
        self.spawns_left -= 1
        if self.spawns_left == 0:
            from openclaw_launch.report.build import build_report  # noqa: F401 - used at the end
            from openclaw_launch.report.format import format_report  # noqa: F401


class _CgroupParticipant(Participant):
    """After each attempt's own kills, the job cgroup is cleared of what escaped the workers' groups."""

    def __init__(self, job: cgroup.JobCgroup) -> None:
        self.job = job

    def end_attempt(self, attempt: int) -> None:
        self.job.clear()


def _make_run_dir(run_dir: Path) -> Path:
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


def _start_mps(plan: LaunchPlan, guardian: Guardian, options: SuperviseOptions) -> MpsDaemon | None:
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
        _say(options, f"openclaw-launch: warning: {warning}")
    return daemon


def _forwarded(signals: list[int], options: SuperviseOptions) -> list[int]:
    """The stopping signals among ``signals`` (a forwarded-only one with no worker running is dropped)."""
    return [s for s in signals if s in options.forwarded_signals and s not in options.pass_signals]


def _not_started(sig: int, options: SuperviseOptions) -> JobResult:
    _say(options, f"openclaw-launch: received {signal_name(sig)} before the workers started; started none")
    return JobResult(exit_code=128 + sig, root_cause=None, attempts=0, results=(), signal_received=sig, unkillable=())


def _with_late_signal(result: JobResult, late: list[int], options: SuperviseOptions) -> JobResult:
    """A signal after the workers were gone (MPS stop, cleanup) counts as one received during the
    job: a root cause keeps its exit code, otherwise it is 128+signal."""
    if not late or result.signal_received is not None:
        return result
    sig = late[0]
    _say(options, f"openclaw-launch: received {signal_name(sig)} while cleaning up after the workers")
    code = result.exit_code if result.root_cause is not None else 128 + sig
    return dataclasses.replace(result, exit_code=code, signal_received=sig)


def _say(options: SuperviseOptions, text: str) -> None:
    stream = options.stderr or sys.stderr
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):  # console gone: the exit code and report still tell
        pass
