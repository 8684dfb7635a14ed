"""``openclaw-launch run``: the plan for this job, and the hand-over to ``launch`` (console ranks,
forwarded signals, agents of a multi-node job, outputs checked before the start). Its options are
``cli/common.py``'s and ``cli/run_options.py``'s, which ``plan`` takes too."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING

import click

from openclaw_launch.cli.common import (
    Common,
    Inputs,
    ScriptLast,
    check_output_option,
    echo_err,
    fail,
    plan_and_config,
    read_inputs,
    stopped_meeting,
    warn,
    with_common,
)
from openclaw_launch.cli.elastic import arrive_elastic, elastic_job, world_planner
from openclaw_launch.cli.exclude import exclude_file
from openclaw_launch.cli.replica_groups import check_before_meeting, replica_groups
from openclaw_launch.cli.run_options import RunOptions, console_choices, startup_timeout_s, with_run_options
from openclaw_launch.cli.straggler import straggler_settings
from openclaw_launch.cli.torchrun_resolve import Resolved
from openclaw_launch.config.model import Config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.format import format_plan_table
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.plan.replica_groups import format_replica_groups

if TYPE_CHECKING:
    from openclaw_launch.agents.elastic_link import ElasticLink, World
    from openclaw_launch.agents.fate import Arrival
    from openclaw_launch.agents.straggler_policy import StragglerSettings
    from openclaw_launch.job.agents import AgentSetup, ElasticJob
    from openclaw_launch.run.prewarm import Zygote


@click.command(cls=ScriptLast)
@with_common
@with_run_options
def run(c: Common, r: RunOptions) -> None:
    """Run SCRIPT [ARGS...] on every planned rank and supervise it."""
    if not c.script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    from openclaw_launch.config.signals import signal_numbers
    from openclaw_launch.job.info_log import INFO, log_level
    from openclaw_launch.job.launch import launch
    from openclaw_launch.run.supervise import SuperviseOptions
    from openclaw_launch.stats.wiring import StatsOptions

    try:
        inputs = read_inputs(c)
        level = log_level(os.environ)  # torchrun's LOGLEVEL, for the launcher's own log
    except OpenclawError as e:
        fail(e)
    want = inputs.want
    console = console_choices(r, c.tr.role, want.local_ranks_shown is not None, os.environ)
    job = elastic_job(c, inputs, r)
    check_before_meeting(r, inputs, job is not None)  # --replica-groups: refused before any node meets
    straggler = straggler_settings(r, inputs.config.runtime if inputs.config else None, job, c.tr.max_restarts)
    exclude_file(r, inputs, job)  # checked before the rendezvous: a bad one starts nothing (exit 2)
    zygote = _early_zygote(c, inputs, r, job) if job and not r.dry_run else None
    try:
        elastic = arrive_elastic(job, inputs, r, c.tr.max_restarts) if job and not r.dry_run else None
    except BaseException:  # exit 2, a signal, or a standby the job did not need: its zygote goes first
        if zygote is not None:
            zygote.close()
        raise
    arrival = _arrive(want, r, c.tr.run_id) if want.by_arrival and not want.elastic and not r.dry_run else None
    try:
        plan, config = plan_and_config(
            c,
            inputs,
            at_run=not r.dry_run,
            run=r,
            arrival=(elastic[0].node_rank, elastic[0].master_port) if elastic else _rank_port(arrival),
            elastic=job.spec if job else None,
            world_nodes=elastic[0].nnodes if elastic else None,
            world_names=elastic[0].nodes if elastic and c.config_path else None,
        )
        groups = replica_groups(c, inputs, r, plan, config, at_run=not r.dry_run)
    except OpenclawError as e:
        fail(e)
    startup_allowance_s = startup_timeout_s(r, config.runtime.startup_timeout_s, plan.hang_timeout_s)
    for w in plan.warnings:
        warn(w)
    if r.dry_run:
        click.echo(format_replica_groups(groups) if groups else format_plan_table(plan, warnings=False))
        return
    if c.tr.no_python:
        rank_env = plan.ranks[0].env if plan.ranks else {}
        _check_command(c.script[0], rank_env.get("PATH", os.environ.get("PATH", os.defpath)))
    if r.report_path:
        check_output_option(r.report_path, "--report")
    if r.stats_file:
        check_output_option(r.stats_file, "--stats-file")
    if r.metrics_port is not None:
        _check_metrics_extra()
    if r.preflight_first:
        _preflight_or_exit(c, inputs, plan.run_id)
    ranks_shown = console.ranks_shown
    if want.local_ranks_shown is not None:
        ranks_shown = frozenset(rank.rank for rank in plan.ranks if rank.local_rank in want.local_ranks_shown)
    log_dir = c.tr.log_dir
    if want.wants_logs and not log_dir and (want.console_hidden or want.local_ranks_shown is not None):
        # Streams the console does not show (-r not teed, or ranks --local-ranks-filter leaves out)
        # exist only in their logs: kept in a temporary directory, which is named (torchrun keeps
        # /tmp/torchelastic_* without saying so). -t alone shows everything: no directory is made.
        import tempfile

        log_dir = tempfile.mkdtemp(prefix="openclaw-logs-")
        warn(f"--redirects/--tee without --log-dir: what the console does not show is logged under {log_dir} (kept)")
    options = SuperviseOptions(
        grace_period_s=c.tr.grace_period_s,
        kill_timeout_s=r.kill_timeout_s,
        max_restarts=c.tr.max_restarts - (elastic[0].round if elastic else 0),  # a node taken in later: fewer left
        restart_backoff_s=r.restart_backoff_s,
        restart_any_class=r.restart_any_class,
        storm_guard=r.storm_guard,
        log_dir=log_dir,
        console_ranks=ranks_shown,
        console_hidden=want.console_hidden,
        prefix_template=console.prefix,
        forwarded_signals=signal_numbers(want.signals),
        pass_signals=console.pass_signals,
        error_files_kept=bool(c.tr.log_dir),
    )
    try:
        agents = _agents(c, inputs, r, plan, config, job, elastic, arrival, straggler)
        stats = StatsOptions(
            interval_s=r.stats_interval_s,
            threshold_pct=r.straggler_threshold_pct,
            hang_timeout_s=plan.hang_timeout_s,
            startup_timeout_s=startup_allowance_s,
            metrics_port=r.metrics_port,
            stats_file=r.stats_file,
            job_line=straggler.policy != "none",
        )
        if groups is not None:  # one node: no agents (plan/replica_groups.py refuses several)
            from openclaw_launch.job.replica_groups import launch_replica_groups

            sys.exit(launch_replica_groups(groups, options, r.report_path, stats, r.exit_code_classes, level <= INFO))
        code = launch(
            plan,
            options,
            report_path=r.report_path,
            parent_error_file=os.environ.get("TORCHELASTIC_ERROR_FILE"),
            stats=stats,
            agents=agents,
            exit_code_classes=r.exit_code_classes,
            info=level <= INFO,
            zygote=zygote,
        )
    except OpenclawError as e:
        fail(e)
    sys.exit(code)


def _early_zygote(c: Common, inputs: Inputs, r: RunOptions, job: ElasticJob) -> Zygote | None:
    """``--prewarm`` in an elastic job: the zygote starts before the wait for a world (a standby waits
    there until a node is lost, then its first workers would wait for the zygote's ``import torch``),
    from the zygote of the plan as ``plan`` shows it; ``launch`` uses it when the world's plan has the
    same one (the workers take their rank's environment whole). None without ``--prewarm``, or where
    that plan fails (the world's plan says why)."""
    if not (c.prewarm or (inputs.config is not None and inputs.config.runtime.prewarm)):
        return None
    try:
        shown, _ = plan_and_config(
            c,
            inputs,
            at_run=False,
            run=r,
            elastic=job.spec,
        )
    except (OpenclawError, click.UsageError):
        return None
    if shown.prewarm is None:
        return None
    from openclaw_launch.run.prewarm import Zygote, zygote_env

    return Zygote.start(shown.prewarm, zygote_env(os.environ, [rank.env for rank in shown.ranks]), echo_err)


def _agents(
    c: Common,
    inputs: Inputs,
    r: RunOptions,
    plan: LaunchPlan,
    config: Config,
    job: ElasticJob | None,
    elastic: tuple[World, ElasticLink] | None,
    arrival: Arrival | None,
    straggler: StragglerSettings,
) -> AgentSetup | None:
    """The agents of a multi-node job (job/agents.py; imports torch's store: several nodes only), and
    where the first node writes the job's report; None for one node."""
    from openclaw_launch.job.agents import arrival_agents, elastic_agents, fixed_agents

    waits = r.agent_waits()
    if elastic is not None:
        assert job is not None
        planner = world_planner(c, inputs, r, job, plan, elastic[0])
        agents = elastic_agents(plan, config, job, waits, c.tr.max_restarts, elastic, planner, straggler)
    elif arrival is not None:
        agents = arrival_agents(plan, config, arrival, c.tr.max_restarts)
    elif plan.nnodes > 1:
        agents = fixed_agents(plan, config, waits, c.tr.max_restarts, r.agent_port)
    else:
        return None
    report_path = r.job_report_path or _job_report_path(r.report_path)
    exclude = exclude_file(r, inputs, job)
    return dataclasses.replace(
        agents, job_report_path=report_path, exclude_file=exclude, gpu_memory_timeout_s=r.gpu_memory_timeout_s
    )


def _preflight_or_exit(c: Common, inputs: Inputs, run_id: str) -> None:
    """``--preflight``: the fabric probe with this job's plan (and run id); the job starts only if no
    tier failed."""
    from openclaw_launch.cli.tools import probe_fabric
    from openclaw_launch.preflight.command import PreflightOptions

    probe = dataclasses.replace(c, script=(), tr=dataclasses.replace(c.tr, run_id=run_id))
    try:
        code = probe_fabric(probe, inputs, PreflightOptions(grace_period_s=c.tr.grace_period_s))
    except OpenclawError as e:
        fail(e)
    if code != 0:
        click.echo(f"openclaw-launch: preflight failed (exit {code}); the job was not started", err=True)
        sys.exit(code)


def _check_command(command: str, path: str) -> None:
    """``--no-python COMMAND`` that is not there: exit 127 before any worker starts (126: not
    executable), as a shell does; numactl would exit 1 for it in every rank."""
    import shutil

    from openclaw_launch import exit_codes

    found = shutil.which(command, path=path) if "/" not in command else command
    if found is None or not os.path.exists(found):
        click.echo(
            f"openclaw-launch: error: --no-python {command}: command not found (not a file, nor on the workers' PATH)",
            err=True,
        )
        sys.exit(exit_codes.NOT_FOUND)
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        click.echo(f"openclaw-launch: error: --no-python {command}: not executable (chmod +x it)", err=True)
        sys.exit(exit_codes.NOT_EXECUTABLE)


def _check_metrics_extra() -> None:
    """--metrics-port without prometheus-client: a usage error now (exit 2), naming the extra."""
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        raise click.BadParameter(
            "needs prometheus-client: pip install 'openclaw-launch[metrics]'", param_hint="--metrics-port"
        )


def _job_report_path(report_path: str | None) -> str | None:
    if not report_path:
        return None
    base, dot, ext = report_path.rpartition(".")
    return f"{base}-job.{ext}" if dot and "/" not in ext else f"{report_path}-job"


def _arrive(want: Resolved, r: RunOptions, rdzv_id: str | None) -> Arrival:
    """Node ranks by arrival (c10d without --node-rank): this launcher's rank and the workers'
    MASTER_PORT from the rendezvous at the endpoint (the agents' port), before the plan is built.
    A signal in the wait exits 128+N; a refusal or no answer exits 2."""
    from openclaw_launch.config.signals import signal_numbers
    from openclaw_launch.job.meeting import meet_by_arrival

    assert want.master_addr is not None and want.master_port is not None and want.nnodes is not None
    if r.agent_port is not None:
        raise click.BadParameter(
            "with c10d and no --node-rank the agents meet at the --rdzv-endpoint port", param_hint="--agent-port"
        )
    if r.preflight_first:
        raise click.BadParameter(
            "needs each node's --node-rank K (not node ranks by arrival)", param_hint="--preflight"
        )
    signals = signal_numbers(want.signals)
    try:
        answer = meet_by_arrival(
            want.master_addr, want.master_port, want.nnodes, r.agent_waits(), signals, echo_err, rdzv_id or "none"
        )
    except OpenclawError as e:
        fail(e)
    if isinstance(answer, int):
        stopped_meeting(answer)
    where = f"{want.master_addr}:{want.master_port}"
    click.echo(f"openclaw-launch: node rank {answer.node_rank} of {want.nnodes} (by arrival at {where})", err=True)
    return answer


def _rank_port(arrival: Arrival | None) -> tuple[int, int] | None:
    return (arrival.node_rank, arrival.master_port) if arrival else None
