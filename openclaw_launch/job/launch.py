"""One run on this node, in order: the workers' store (node rank 0: agents/worker_store.py), the
agents' meeting (several nodes), the run directory, guardian,
cgroup and MPS daemon (run/setup.py), the statistics, supervision with every participant, then the
node's and the job's reports (job/reports.py).

Everything is undone on every path (success, failure, signal, exception), and the guardian undoes
it if the launcher itself is SIGKILLed. The forwarded signals are caught for the whole run, not
only while ``supervise`` runs: one that arrives while the MPS daemon starts means no worker starts,
one that arrives while it stops still makes the exit code 128+signal, and neither kills the
launcher halfway through its cleanup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from openclaw_launch.agents.worker_store import WorkerStore
from openclaw_launch.files import write_atomic
from openclaw_launch.job.agents import AgentSetup, job_live_target
from openclaw_launch.job.info_log import InfoLog
from openclaw_launch.job.node_health import equip, node_health
from openclaw_launch.job.participants import participants_of
from openclaw_launch.job.reports import job_report, node_report
from openclaw_launch.plan.context import LogDir
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run import cgroup, console
from openclaw_launch.run.errorfile import write_parent_error_file
from openclaw_launch.run.failure_policy import FailurePolicy
from openclaw_launch.run.guard import Guardian
from openclaw_launch.run.osproc import RealOs
from openclaw_launch.run.setup import (
    forwarded,
    job_cgroup_for,
    make_run_dir,
    not_started,
    open_files_for,
    say,
    start_mps,
    start_zygote,
    with_late_signal,
)
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, supervise
from openclaw_launch.stats.wiring import StatsOptions, binding_warnings, start_statistics

if TYPE_CHECKING:
    from collections.abc import Callable

    from openclaw_launch.agents.fate import Agent
    from openclaw_launch.job.group_progress import GroupProgress
    from openclaw_launch.report.model import PreflightVerdict
    from openclaw_launch.run.failure_class import Failure
    from openclaw_launch.run.prewarm import Zygote
    from openclaw_launch.stats.judged import Judged
    from openclaw_launch.stats.result import SessionResult
    from openclaw_launch.stats.session import StatsSession


_FINAL_DRAIN_S = 5.0  # at exit, the console gets this long to take what is queued


def launch(
    plan: LaunchPlan,
    options: SuperviseOptions,
    report_path: str | None = None,
    parent_error_file: str | None = None,
    stats: StatsOptions | None = None,
    agents: AgentSetup | None = None,
    preflight: Callable[[int], PreflightVerdict] | None = None,
    exit_code_classes: bool = False,
    info: bool = False,
    progress: GroupProgress | None = None,
    zygote: Zygote | None = None,
) -> int:
    """Run the plan; return the launcher's exit code. ``parent_error_file``: the launcher's own
    TORCHELASTIC_ERROR_FILE, which receives a failed job's root cause as torchrun writes it.
    ``agents``: a multi-node job (openclaw_launch/agents): meet the other nodes first, share their fate.
    ``preflight``: judges the workers' measurements once they ended (given the exit code); its verdict
    goes into the report. ``exit_code_classes``: a failed job exits 70 or 75 by its failure class
    (exit_codes.py), not with the worker's code. ``info``: LOGLEVEL INFO or lower (job/info_log.py).
    ``progress``: a replica group's account of its attempts (job/replica_groups.py), one more participant.
    ``zygote``: the ``--prewarm`` zygote an elastic launcher started before its wait for a world."""
    hint = str(LogDir.of(options.log_dir, plan.run_id).path) if options.log_dir else None
    out, err = console.wrap(options.stdout or sys.stdout, hint), console.wrap(options.stderr or sys.stderr, hint)
    options = dataclasses.replace(options, stdout=out, stderr=err)  # never blocks supervision
    os_layer = RealOs()
    open_files_for(len(plan.ranks), bool(options.log_dir))
    os_layer.install_signals((*options.forwarded_signals, *options.pass_signals))
    agent: Agent | None = None
    store = WorkerStore(functools.partial(say, options))
    prewarmed = contextlib.ExitStack()
    try:
        store.host(plan.ranks)  # before the nodes meet: a port in use is exit 2 on this node alone
        start_zygote(plan, os_layer, prewarmed, options, zygote)  # --prewarm: it imports while the nodes meet
        if agents is not None:
            met = _meet(plan, agents, options, os_layer)
            if isinstance(met, int):
                return met
            agent = met
            stats = stats or StatsOptions()  # the job's live verdict: every node's helper to the agents' store
            stats = dataclasses.replace(stats, job_live=job_live_target(agents, plan.run_id, stats.threshold_pct))
            if agents.make_agent is not None:  # elastic: node 0's straggler policy (--on-straggler exclude)
                stats = dataclasses.replace(stats, on_judged=_straggler_watch(agent, info))
        result, statistics, failures = _run(
            plan,
            options,
            os_layer,
            parent_error_file,
            stats or StatsOptions(),
            agent,
            exit_code_classes,
            store,
            info,
            progress,
        )
        result = with_late_signal(result, forwarded(os_layer.drain_signals(), options), options)
        code = result.exit_code  # with agents: the job's fate, the same on every node (supervise.py)
        report = node_report(
            plan,
            result,
            statistics,
            failures,
            dropped_lines=console.dropped_lines(out) + console.dropped_lines(err),
            verdict=preflight(code) if preflight is not None else None,
            agent=agent,
            elastic=agents is not None and agents.make_agent is not None,
            report_path=report_path,
            options=options,
        )
        if agent is not None and agents is not None:
            job_report(agent, agents.job_report_path, report, statistics, code, options)
        return code
    finally:
        if agent is not None:
            agent.close()
        prewarmed.close()
        store.close()
        os_layer.restore_signals()
        for c in (out, err):  # what the console still holds, for a bounded time: then we exit anyway
            if isinstance(c, console.Console):
                c.drain(_FINAL_DRAIN_S)


def _straggler_watch(agent: Agent, info: bool) -> Callable[[Judged], None] | None:
    """Node 0 of an elastic job that excludes stragglers: its agent acts on every interval's verdict
    (``info``, LOGLEVEL INFO: and says each one)."""
    from openclaw_launch.agents.elastic_agent import ElasticAgent

    if not isinstance(agent, ElasticAgent) or not agent.watches_stragglers:
        return None
    agent.straggler.info = info
    return agent.observe


def _meet(plan: LaunchPlan, agents: AgentSetup, options: SuperviseOptions, os_layer: RealOs) -> Agent | int:
    """This node's agent, joined to the others and started; an exit code when a stopping signal
    came first (no worker started)."""
    from openclaw_launch.agents.fate import Agent

    tell = functools.partial(say, options)
    agent = agents.make_agent(tell) if agents.make_agent else Agent(plan, agents.options, tell, agents.link)
    equip(agent, agents)
    try:
        early = agent.join(agents.fingerprint, lambda: next(iter(forwarded(os_layer.drain_signals(), options)), None))
        if early is None:
            agent.start()
            return agent
    except BaseException:
        agent.close()
        raise
    agent.close()
    return not_started(early, options).exit_code


def _run(
    plan: LaunchPlan,
    options: SuperviseOptions,
    os_layer: RealOs,
    parent_error_file: str | None,
    stats: StatsOptions,
    agent: Agent | None = None,
    exit_code_classes: bool = False,
    store: WorkerStore | None = None,
    info: bool = False,
    progress: GroupProgress | None = None,
) -> tuple[JobResult, SessionResult | None, dict[int, Failure]]:
    """Set everything up, supervise, tear everything down (in reverse order, whatever happens).
    Returns the job's result, its statistics and each attempt's classified failure."""
    run_dir = make_run_dir(Path(plan.run_dir.path))  # the plan's paths (plan/context.py); it adds nothing to a rank
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
        job_cgroup = job_cgroup_for(plan, guardian, os_layer, undo)
        if plan.parallel is not None:  # the groups file OPENCLAW_PARALLEL_FILE names (parallel.py)
            write_atomic(plan.run_dir.parallel_file, json.dumps(plan.parallel.to_json()))
        daemon = start_mps(plan, guardian, options) if plan.mps is not None else None
        if daemon is not None:
            undo.callback(daemon.stop)
        if plan.telemetry_socket is not None:
            session = start_statistics(plan, plan.telemetry_socket, stats, options, functools.partial(say, options))
            undo.callback(session.close)
        elif stats.hang_timeout_s or stats.metrics_port is not None or stats.stats_file:
            say(
                options,
                "openclaw-launch: warning: --telemetry off: no progress from the workers, so "
                "--hang-timeout-s, --metrics-port and --stats-file are off",
            )
        early = forwarded(os_layer.drain_signals(), options)
        policy = _failure_policy(plan, options, session, job_cgroup)
        if early:  # e.g. Ctrl-C while the MPS daemon started: start no worker at all
            result = not_started(early[0], options)
        else:
            participants = participants_of(len(plan.ranks), policy, daemon, job_cgroup, session, agent, store)
            participants += node_health(agent, plan, policy, session, functools.partial(say, options))
            if info:
                participants.append(InfoLog(functools.partial(say, options)))
            if progress is not None:
                progress.attach(session.steps_of if session is not None else None)
                participants.append(progress)
            result = supervise(plan, options, os_layer, participants, guardian=guardian)
        from openclaw_launch.report.build import CONTAINMENT  # the report's types load after the spawn

        joined = job_cgroup if job_cgroup is not None and job_cgroup.joinable() else None  # probed beside the spawn
        containment = f"cgroup2:{joined.path}+{CONTAINMENT}" if joined is not None else CONTAINMENT
        result = dataclasses.replace(result, containment=containment)
        if exit_code_classes:  # 70 / 75 by the last attempt's failure class (docs/failures.md)
            code = policy.exit_code(result.exit_code, result.attempts, result.signal_received)
            result = dataclasses.replace(result, exit_code=code)
        if parent_error_file and result.exit_code != 0:  # before the workers' files go with run_dir
            write_parent_error_file(parent_error_file, result, lambda msg: say(options, msg))
        statistics = session.finish(binding_warnings(result)) if session is not None else None
    return result, statistics, policy.failures


def _failure_policy(
    plan: LaunchPlan, options: SuperviseOptions, session: StatsSession | None, job_cgroup: cgroup.JobCgroup | None
) -> FailurePolicy:
    """Classification and the restart rules, with the evidence this node has: each rank's steps
    and the GPUs' NVML events (statistics), the OOM kills of the job's cgroup (or the launcher's own)."""
    dirs = (job_cgroup.path if job_cgroup is not None else None, cgroup.own_dir())
    oom_dir = next((d for d in dirs if d is not None and cgroup.oom_kills(d) is not None), None)
    return FailurePolicy(
        {r.rank: r.gpu_uuid for r in plan.ranks},
        options.max_restarts,
        functools.partial(say, options),
        steps_of=session.steps_of if session is not None else None,
        oom_kills=functools.partial(cgroup.oom_kills, oom_dir) if oom_dir is not None else None,
        gpu_events=session.gpu_events if session is not None else None,
        restart_any_class=options.restart_any_class,
        storm_guard=options.storm_guard,
    )
