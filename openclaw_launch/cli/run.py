"""``openclaw-launch run``: its options, the plan for this job, and the hand-over to ``launch``
(console ranks, forwarded signals, agents of a multi-node job, outputs checked before the start)."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from typing import Any

import click

from openclaw_launch.cli import option_types
from openclaw_launch.cli.common import (
    SCRIPT_LAST,
    Common,
    check_output_option,
    fail,
    plan_and_config,
    warn,
    with_common,
)
from openclaw_launch.cli.torchrun_resolve import resolve
from openclaw_launch.config import defaults
from openclaw_launch.config.model import Config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.build import LaunchPlan, format_plan_table
from openclaw_launch.plan.parallel import PARALLEL_FILE_NAME
from openclaw_launch.telemetry.wire import TELEMETRY_MODES


@click.command(context_settings=SCRIPT_LAST)
@with_common
@click.option(
    "--restart-backoff-s",
    type=option_types.seconds(),
    default=defaults.RESTART_BACKOFF_S,
    show_default=True,
    help=f"Wait before restart k: this times 2**k (at most {defaults.RESTART_BACKOFF_MAX_S:g} s).",
)
@click.option(
    "--kill-timeout-s",
    type=option_types.seconds(),
    default=defaults.KILL_TIMEOUT_S,
    show_default=True,
    help="After SIGKILL, how long to wait for workers stuck in the kernel before giving up.",
)
@click.option(
    "--console-ranks",
    default="all",
    show_default=True,
    help="Ranks shown on the console: all, none, or 0,3-5 (torchrun's --local-ranks-filter, by global rank).",
)
@click.option(
    "--prefix",
    "prefix_template",
    default=None,
    help="Console line prefix; fields {rank}, {local_rank}, {node} "
    f"(default: {defaults.CONSOLE_PREFIX!r}, or "
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE).",
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the run report JSON here.")
@click.option(
    "--telemetry",
    type=click.Choice(TELEMETRY_MODES),
    default=defaults.TELEMETRY_MODE,
    show_default=True,
    help="Per-step statistics: hooks = zero-code torch hooks and the telemetry API; full = the same plus, "
    "on GPUs, NCCL's flight recorder (the wait signal that names a rank slow in GPU work; it costs about "
    "1 % of step time); api = only telemetry.step()/section(); off = none. torchrun has none.",
)
@click.option(
    "--stats-interval-s",
    type=option_types.seconds(),
    default=defaults.STATS_INTERVAL_S,
    show_default=True,
    help="Print a one-line straggler summary this often while the job runs (0 = never).",
)
@click.option(
    "--straggler-threshold-pct",
    type=option_types.percent(),
    default=defaults.STRAGGLER_THRESHOLD_PCT,
    show_default=True,
    help="Name a straggler when one rank is busy this % of the median step longer than the others.",
)
@click.option(
    "--hang-timeout-s",
    type=option_types.hang_timeout(),
    default=None,
    help="A rank with no step for this long (armed after its first step) is a hang: it is named with its "
    "stack, every rank's stack goes to its log, and the job stops with exit code 124 (default: off; "
    "config runtime.hang_timeout_s). docs/hangs-and-metrics.md.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve live per-rank and per-GPU metrics in Prometheus format on this port (0 = any free port; "
    "needs the 'metrics' extra, prometheus-client). Default: off.",
)
@click.option(
    "--stats-file",
    "stats_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append the live statistics as one JSON line every --stats-interval-s (and one at the end).",
)
@click.option(
    "--forward-signals",
    type=option_types.signal_list(allow_none=True),
    default=",".join(defaults.FORWARD_ONLY_SIGNALS),
    show_default=True,
    envvar="OPENCLAW_FORWARD_SIGNALS",
    help="Signals forwarded to the workers WITHOUT stopping the job (checkpoint requests: Slurm's "
    "--signal=B:USR1@90); 'none' for none. A signal here and in --signals-to-handle is forwarded only.",
)
@click.option(
    "--agent-port",
    type=click.IntRange(1, 65535),
    envvar="OPENCLAW_AGENT_PORT",
    help="Several nodes: the port the first node's agent listens on (default MASTER_PORT+1).",
)
@click.option(
    "--agent-timeout-s",
    type=click.FloatRange(min=1),
    default=defaults.AGENT_TIMEOUT_S,
    show_default=True,
    envvar="OPENCLAW_AGENT_TIMEOUT_S",
    help="Several nodes: how long the agents wait for every node before starting nothing.",
)
@click.option(
    "--keepalive-s",
    type=click.FloatRange(min=0.5),
    default=defaults.KEEPALIVE_S,
    show_default=True,
    envvar="OPENCLAW_KEEPALIVE_S",
    help="Several nodes: a node silent this long is lost, and every other node stops its workers.",
)
@click.option(
    "--job-report",
    "job_report_path",
    type=click.Path(dir_okay=False),
    help="Several nodes: the first node writes the whole job's report here (default: next to --report, "
    "with -job before .json).",
)
@click.option(
    "--preflight",
    "preflight_first",
    is_flag=True,
    help="First run `preflight` with this plan (config preflight: settings); a failing tier or probe starts "
    "nothing and exits with preflight's code (docs/preflight.md); a warning starts the job.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
def run(
    c: Common,
    restart_backoff_s: float,
    kill_timeout_s: float,
    console_ranks: str,
    prefix_template: str | None,
    report_path: str | None,
    telemetry: str,
    stats_interval_s: float,
    straggler_threshold_pct: float,
    hang_timeout_s: float | None,
    metrics_port: int | None,
    stats_file: str | None,
    forward_signals: tuple[str, ...],
    agent_port: int | None,
    agent_timeout_s: float,
    keepalive_s: float,
    job_report_path: str | None,
    preflight_first: bool,
    dry_run: bool,
) -> None:
    """Run SCRIPT [ARGS...] on every planned rank and supervise it."""
    if not c.script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    from openclaw_launch.cli.torchrun_resolve import check_prefix, prefix_from_env
    from openclaw_launch.config.signals import signal_numbers
    from openclaw_launch.run.launch import StatsOptions, launch, run_dir_for
    from openclaw_launch.run.supervise import SuperviseOptions

    want = resolve(c.tr, with_config=bool(c.config_path))
    env_prefix = os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    if prefix_template is not None:
        prefix = check_prefix(prefix_template)
    elif env_prefix:
        prefix = check_prefix(prefix_from_env(env_prefix, c.tr.role), "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    else:
        prefix = defaults.CONSOLE_PREFIX
    pass_signals = signal_numbers(forward_signals)
    if want.local_ranks_shown is not None and console_ranks != "all":
        raise click.UsageError("--console-ranks and --local-ranks-filter both choose the console's ranks; give one")
    given_ids = {c.tr.run_id, os.environ.get("SLURM_JOB_ID")} - {None}
    job_id = c.tr.run_id or os.environ.get("SLURM_JOB_ID") or uuid.uuid4().hex[:12]
    ranks_shown = _console_ranks(console_ranks)
    log_dir = c.tr.log_dir
    # Error files live with the logs when there are any (kept), else in the run directory (removed).
    run_dir = run_dir_for(job_id)
    errors = f"{log_dir}/{job_id}/errors" if log_dir else str(run_dir / "errors")
    socket_path = None if telemetry == "off" else str(run_dir / "telemetry.sock")
    parallel_file = str(run_dir / PARALLEL_FILE_NAME)
    try:
        plan, config = plan_and_config(c, job_id, errors, socket_path, telemetry, parallel_file)
        if plan.nnodes > 1 and job_id not in given_ids:
            # Several nodes must share the run id (TORCHELASTIC_RUN_ID, log directory): a random one
            # would differ on every node, so the default is torchrun's, "none".
            job_id = "none"
            run_dir = run_dir_for(job_id)
            errors = f"{log_dir}/{job_id}/errors" if log_dir else str(run_dir / "errors")
            socket_path = None if telemetry == "off" else str(run_dir / "telemetry.sock")
            parallel_file = str(run_dir / PARALLEL_FILE_NAME)
            plan, config = plan_and_config(c, job_id, errors, socket_path, telemetry, parallel_file)
    except OpenclawError as e:
        fail(e)
    for w in plan.warnings:
        warn(w)
    if report_path and not dry_run:
        check_output_option(report_path, "--report")
    if stats_file and not dry_run:
        check_output_option(stats_file, "--stats-file")
    if metrics_port is not None and not dry_run:
        _check_metrics_extra()
    if dry_run:
        click.echo(format_plan_table(plan, warnings=False))
        return
    if preflight_first:
        _preflight_or_exit(c, job_id)
    if want.local_ranks_shown is not None:
        ranks_shown = frozenset(r.rank for r in plan.ranks if r.local_rank in want.local_ranks_shown)
    if want.wants_logs and not log_dir:  # torchrun keeps -r/-t logs in a temporary directory too
        import tempfile

        log_dir = tempfile.mkdtemp(prefix="openclaw-logs-")
        warn(f"--redirects/--tee without --log-dir: logs under {log_dir}")
    options = SuperviseOptions(
        grace_period_s=c.tr.grace_period_s,
        kill_timeout_s=kill_timeout_s,
        max_restarts=c.tr.max_restarts,
        restart_backoff_s=restart_backoff_s,
        log_dir=log_dir,
        console_ranks=ranks_shown,
        console_hidden=want.console_hidden,
        prefix_template=prefix,
        forwarded_signals=signal_numbers(want.signals),
        pass_signals=pass_signals,
        error_files_kept=bool(c.tr.log_dir),
    )
    try:
        agents = None
        if plan.nnodes > 1:
            agents = _agent_setup(plan, config, agent_port, agent_timeout_s, keepalive_s, c.tr.max_restarts)
            agents = dataclasses.replace(agents, job_report_path=job_report_path or _job_report_path(report_path))
        stats = StatsOptions(
            interval_s=stats_interval_s,
            threshold_pct=straggler_threshold_pct,
            hang_timeout_s=hang_timeout_s if hang_timeout_s is not None else config.runtime.hang_timeout_s,
            metrics_port=metrics_port,
            stats_file=stats_file,
        )
        code = launch(
            plan,
            options,
            report_path=report_path,
            parent_error_file=os.environ.get("TORCHELASTIC_ERROR_FILE"),
            stats=stats,
            agents=agents,
        )
    except OpenclawError as e:
        fail(e)
    sys.exit(code)


def _preflight_or_exit(c: Common, job_id: str) -> None:
    """``--preflight``: the fabric probe with this job's plan; the job starts only if no tier failed."""
    from openclaw_launch.cli.tools import probe_fabric
    from openclaw_launch.preflight.command import PreflightOptions

    try:
        code = probe_fabric(
            dataclasses.replace(c, script=()), job_id, PreflightOptions(grace_period_s=c.tr.grace_period_s)
        )
    except OpenclawError as e:
        fail(e)
    if code != 0:
        click.echo(f"openclaw-launch: preflight failed (exit {code}); the job was not started", err=True)
        sys.exit(code)


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


def _agent_setup(
    plan: LaunchPlan, config: Config, port: int | None, timeout_s: float, keepalive_s: float, max_restarts: int
) -> Any:
    """Where the agents meet and what this node must agree on (imports torch: several nodes only)."""
    from openclaw_launch.agents.fate import AgentOptions
    from openclaw_launch.agents.fingerprint import fingerprint, runtime_versions
    from openclaw_launch.run.launch import AgentSetup

    if port is None:
        port = plan.master_port + 1 if plan.master_port < 65535 else plan.master_port - 1
    if port == plan.master_port:
        raise click.BadParameter(
            f"{port} is MASTER_PORT; the agents need a port of their own", param_hint="--agent-port"
        )
    python = os.environ.get("PYTHON_EXEC") or sys.executable
    versions = runtime_versions(python)
    options = AgentOptions(
        store_addr=config.nodes[0].ip or plan.master_addr,
        port=port,
        nodes=tuple(n.name for n in config.nodes),
        join_timeout_s=timeout_s,
        keepalive_s=keepalive_s,
        max_restarts=max_restarts,
    )
    return AgentSetup(options=options, fingerprint=fingerprint(config, plan, versions, os.environ))


def _console_ranks(text: str) -> frozenset[int] | None:
    """``all`` -> None (every rank), ``none`` -> no rank, else a list like ``0,3-5``."""
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    from openclaw_launch.topology.cpulist import parse_cpulist

    try:
        return frozenset(parse_cpulist(text))
    except ValueError as e:
        raise click.BadParameter(
            f"{text!r}: use all, none, or ranks like 0,3-5 ({e})", param_hint="--console-ranks"
        ) from None
