"""Command line: ``run`` (the default), ``plan``, ``preflight``, ``discover``, ``validate``, ``report``.

Thin: parse options, gather inputs (config, topology), call the pure planner,
hand the plan to the effects (MPS, supervisor). Every user error exits 2 with
one message and no traceback, before anything is started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click

from openclaw_launch import option_types
from openclaw_launch.config import BindingPolicy, Config, load_config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.parallel import PARALLEL_DIMS, PARALLEL_FILE_NAME, ParallelSpec
from openclaw_launch.plan import Entry, EntryKind, LaunchPlan, PlanOptions, build_plan, format_plan_table
from openclaw_launch.telemetry.wire import TELEMETRY_MODES
from openclaw_launch.topology.model import Topology
from openclaw_launch.torchrun_compat import FLAGS, TorchrunArgs
from openclaw_launch.torchrun_resolve import free_port, misspelled_command, node_by_rank, resolve

if TYPE_CHECKING:
    from openclaw_launch.mps import MpsStatus

SUBCOMMANDS = ("run", "plan", "preflight", "discover", "validate", "report")


def _fail(err: OpenclawError) -> NoReturn:
    click.echo(f"openclaw-launch: {err}", err=True)
    sys.exit(err.exit_code)


def _warn(message: str) -> None:
    click.echo(f"openclaw-launch: warning: {message}", err=True)


def _live_topology(with_gpus: bool) -> Topology:
    """Read this host; NVML is only touched when GPUs are wanted (it costs start-up time)."""
    from openclaw_launch.topology.live import discover_topology
    from openclaw_launch.topology.nvml import no_gpus

    return discover_topology(nvml=None if with_gpus else no_gpus())


def _topology(snapshot: str | None, with_gpus: bool) -> Topology:
    if snapshot:
        from openclaw_launch.topology.snapshot import load_snapshot

        return load_snapshot(Path(snapshot))
    return _live_topology(with_gpus)


def _make_plan(
    c: _Common,
    run_id: str | None = None,
    error_file_dir: str | None = None,
    telemetry_socket: str | None = None,
    telemetry_mode: str = "hooks",
    parallel_file: str | None = None,
) -> LaunchPlan:
    """The plan for the command line: ``--config``, or this host as torchrun would see it."""
    return _plan_and_config(c, run_id, error_file_dir, telemetry_socket, telemetry_mode, parallel_file)[0]


def _plan_and_config(
    c: _Common,
    run_id: str | None = None,
    error_file_dir: str | None = None,
    telemetry_socket: str | None = None,
    telemetry_mode: str = "hooks",
    parallel_file: str | None = None,
) -> tuple[LaunchPlan, Config]:
    want = resolve(c.tr, with_config=bool(c.config_path))
    entry = _entry(c.script or ("train.py",), c.tr)  # plan: the script only shows in argv
    if c.config_path:
        if want.nproc_per_node is not None:
            raise click.UsageError(
                "--nproc-per-node (or PET_NPROC_PER_NODE) is for runs without --config; the config sets the ranks"
            )
        config = load_config(c.config_path)  # its warnings come back in the plan's
        node_name = node_by_rank(config, want.nnodes, want.node_rank, c.node) or _node_name(config, c.node)
        topology = _topology(c.topology_path, not config.node(node_name).is_cpu)
    else:
        if c.node is not None:
            raise click.UsageError("--node names a node of --config; without --config use --nnodes and --node-rank")
        from openclaw_launch.topology.discover import host_config

        topology = _topology(c.topology_path, want.nproc_per_node != "cpu")
        config = host_config(topology, want.nproc_per_node, want.nnodes or 1)
        node_name = config.nodes[want.node_rank or 0].name
    if want.binding:
        config = dataclasses.replace(
            config, runtime=dataclasses.replace(config.runtime, binding=cast(BindingPolicy, want.binding))
        )
    options = PlanOptions(
        entry=entry,
        node=node_name,
        python=os.environ.get("PYTHON_EXEC") or sys.executable,  # torchrun's PYTHON_EXEC
        base_env=dict(os.environ),
        run_id=run_id or c.tr.run_id or "none",
        master_addr=want.master_addr,
        master_port=want.master_port,
        max_restarts=c.tr.max_restarts,
        error_file_dir=error_file_dir,
        numactl=shutil.which("numactl"),
        strictness=c.strictness,
        role=c.tr.role,
        signals_to_handle=",".join(want.signals),
        virtual_local_rank=c.tr.virtual_local_rank,
        free_master_port=free_port() if len(config.nodes) == 1 else None,
        telemetry_socket=telemetry_socket,
        telemetry_mode=telemetry_mode,
        parallel=ParallelSpec(c.tp, c.pp, c.dp, where={d: f"--{d}" for d in PARALLEL_DIMS if getattr(c, d)}),
        parallel_file=parallel_file,
        fallback_master_addr=_slurm_first_host() if len(config.nodes) > 1 else None,
    )
    return build_plan(config, topology, options), config


def _slurm_first_host() -> str | None:
    """The first host Slurm allocated to this step (or job): the multi-node MASTER_ADDR default."""
    text = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not text:
        return None
    from openclaw_launch.agents.hostlist import expand_hostlist

    hosts = expand_hostlist(text)
    return hosts[0] if hosts else None


def _node_name(config: Config, cli_node: str | None) -> str:
    from openclaw_launch.multinode import local_identity, resolve_node

    if cli_node is None and len(config.nodes) > 1 and "SLURM_NODEID" not in os.environ:
        names, addrs = local_identity()
        return resolve_node(config, None, os.environ, names, addrs)
    return resolve_node(config, cli_node, os.environ)


def _entry(script: tuple[str, ...], tr: TorchrunArgs) -> Entry:
    """What each worker runs; ``--run-path`` runs the script as __main__ like ``python -u script``."""
    if not script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    kind: EntryKind = "script" if tr.run_path else "module" if tr.module else "exec" if tr.no_python else "script"
    return Entry(kind=kind, target=script[0], args=tuple(script[1:]))


class _DefaultRun(click.Group):
    """``openclaw-launch [run options] train.py`` is ``openclaw-launch run ...`` (torchrun's shape)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in SUBCOMMANDS and args[0] not in ("--help", "-h", "--version"):
            meant = misspelled_command(args[0], SUBCOMMANDS, os.path.exists(args[0]))
            if meant:
                raise click.UsageError(f"no command {args[0]!r} and no such file; did you mean {meant!r}?")
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRun, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="openclaw-launch")
def cli() -> None:
    """Topology-aware launcher: every rank on its GPU by UUID, on that GPU's NUMA node.

    Run a job as with torchrun, with torchrun's flags: `openclaw-launch [OPTIONS] train.py [ARGS]...`
    is `openclaw-launch run ...` (see `openclaw-launch run --help`, docs/torchrun-compat.md).
    """


@dataclass(frozen=True)
class _Common:
    """What ``run`` and ``plan`` share: where the ranks come from and what they run."""

    config_path: str | None
    node: str | None
    topology_path: str | None
    strictness: str | None
    tp: int | None
    pp: int | None
    dp: int | None
    script: tuple[str, ...]
    tr: TorchrunArgs  # every torchrun flag (torchrun_compat.FLAGS)


_common_options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="Cluster YAML (replaces torchrun's --nnodes/--nproc-per-node: the config lays out the ranks).",
    ),
    click.option(
        "--node",
        help="Which config node this launcher is (default: --node-rank, Slurm, or matched to this host).",
    ),
    click.option(
        "--topology",
        "topology_path",
        type=click.Path(dir_okay=False),
        help="Topology snapshot JSON to use instead of this host (discover --snapshot).",
    ),
    click.option(
        "--strictness",
        type=click.Choice(["fail", "warn"]),
        help="Bus id / NUMA / NVLink mismatches fail the launch or only warn.",
    ),
    *(
        click.option(
            f"--{dim}", dim, type=click.IntRange(min=1), help=f"{what} (overrides the config's parallel.{dim})."
        )
        for dim, what in (
            ("tp", "Tensor-parallel group size; TP groups stay on one node, on NVLink-joined GPUs."),
            ("pp", "Pipeline-parallel stages."),
            ("dp", "Data-parallel size (default: world size / (tp * pp))."),
        )
    ),
    *(flag.option() for flag in FLAGS),
    click.argument("script", nargs=-1, type=click.UNPROCESSED),
]


def _with_common(f: Callable[..., None]) -> Callable[..., None]:
    """Add the shared options and hand them to ``f`` as one ``_Common``."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> None:
        tr = TorchrunArgs(**{name: kw.pop(name) for name in TorchrunArgs.__dataclass_fields__})
        mine = {name: kw.pop(name) for name in _Common.__dataclass_fields__ if name != "tr"}
        f(_Common(**mine, tr=tr), **kw)

    for option in reversed(_common_options):
        wrapper = option(wrapper)
    return wrapper


# Options end at the script: an unknown option before it is an error (with "did you mean"), and
# everything after it goes to the script untouched, as with torchrun.
_SCRIPT_LAST = {"allow_interspersed_args": False}


@cli.command(context_settings=_SCRIPT_LAST)
@_with_common
@click.option(
    "--restart-backoff-s",
    type=option_types.seconds(),
    default=1.0,
    show_default=True,
    help="Wait before restart k: this times 2**k (at most 30 s).",
)
@click.option(
    "--kill-timeout-s",
    type=option_types.seconds(),
    default=5.0,
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
    help="Console line prefix; fields {rank}, {local_rank}, {node} (default: '[rank {rank}] ', or "
    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE).",
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the run report JSON here.")
@click.option(
    "--telemetry",
    type=click.Choice(TELEMETRY_MODES),
    default="hooks",
    show_default=True,
    help="Per-step statistics: hooks = zero-code torch hooks and the telemetry API; full = the same plus, "
    "on GPUs, NCCL's flight recorder (the wait signal that names a rank slow in GPU work; it costs about "
    "1 % of step time); api = only telemetry.step()/section(); off = none. torchrun has none.",
)
@click.option(
    "--stats-interval-s",
    type=option_types.seconds(),
    default=60.0,
    show_default=True,
    help="Print a one-line straggler summary this often while the job runs (0 = never).",
)
@click.option(
    "--straggler-threshold-pct",
    type=option_types.percent(),
    default=5.0,
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
    default="SIGUSR1,SIGUSR2",
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
    default=300.0,
    show_default=True,
    envvar="OPENCLAW_AGENT_TIMEOUT_S",
    help="Several nodes: how long the agents wait for every node before starting nothing.",
)
@click.option(
    "--keepalive-s",
    type=click.FloatRange(min=0.5),
    default=15.0,
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
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
def run(
    c: _Common,
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
    forward_signals: str,
    agent_port: int | None,
    agent_timeout_s: float,
    keepalive_s: float,
    job_report_path: str | None,
    dry_run: bool,
) -> None:
    """Run SCRIPT [ARGS...] on every planned rank and supervise it."""
    if not c.script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    from openclaw_launch.launch import StatsOptions, launch, run_dir_for
    from openclaw_launch.supervise import SuperviseOptions
    from openclaw_launch.torchrun_resolve import check_prefix, prefix_from_env, signal_numbers

    want = resolve(c.tr, with_config=bool(c.config_path))
    env_prefix = os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    if prefix_template is not None:
        prefix = check_prefix(prefix_template)
    elif env_prefix:
        prefix = check_prefix(prefix_from_env(env_prefix, c.tr.role), "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    else:
        prefix = "[rank {rank}] "
    pass_signals = _pass_signals(forward_signals)
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
        plan, config = _plan_and_config(c, job_id, errors, socket_path, telemetry, parallel_file)
        if plan.nnodes > 1 and job_id not in given_ids:
            # Several nodes must share the run id (TORCHELASTIC_RUN_ID, log directory): a random one
            # would differ on every node, so the default is torchrun's, "none".
            job_id = "none"
            run_dir = run_dir_for(job_id)
            errors = f"{log_dir}/{job_id}/errors" if log_dir else str(run_dir / "errors")
            socket_path = None if telemetry == "off" else str(run_dir / "telemetry.sock")
            parallel_file = str(run_dir / PARALLEL_FILE_NAME)
            plan, config = _plan_and_config(c, job_id, errors, socket_path, telemetry, parallel_file)
    except OpenclawError as e:
        _fail(e)
    for w in plan.warnings:
        _warn(w)
    if report_path and not dry_run:
        _check_output(report_path, "--report")
    if stats_file and not dry_run:
        _check_output(stats_file, "--stats-file")
    if metrics_port is not None and not dry_run:
        _check_metrics_extra()
    if dry_run:
        click.echo(format_plan_table(plan, warnings=False))
        return
    if want.local_ranks_shown is not None:
        ranks_shown = frozenset(r.rank for r in plan.ranks if r.local_rank in want.local_ranks_shown)
    if want.wants_logs and not log_dir:  # torchrun keeps -r/-t logs in a temporary directory too
        import tempfile

        log_dir = tempfile.mkdtemp(prefix="openclaw-logs-")
        _warn(f"--redirects/--tee without --log-dir: logs under {log_dir}")
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
        _fail(e)
    sys.exit(code)


def _check_output(path: str, option: str) -> None:
    """An output path that cannot be written is a usage error now, not after the job."""
    from openclaw_launch.files import check_output_path

    problem = check_output_path(path)
    if problem:
        raise click.BadParameter(f"cannot write there: {problem}; give a writable file path", param_hint=option)


def _check_metrics_extra() -> None:
    """--metrics-port without prometheus-client: a usage error now (exit 2), naming the extra."""
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        raise click.BadParameter(
            "needs prometheus-client: pip install 'openclaw-launch[metrics]'", param_hint="--metrics-port"
        )


def _pass_signals(text: str) -> tuple[int, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    import signal

    names = [s.strip().upper() for s in text.split(",") if s.strip()]
    numbers = []
    for name in names:
        name = name if name.startswith("SIG") else "SIG" + name
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals) or name in ("SIGKILL", "SIGSTOP", "SIGCHLD"):
            raise click.BadParameter(f"{name!r} is not a signal that can be forwarded", param_hint="--forward-signals")
        numbers.append(int(sig))
    return tuple(numbers)


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
    from openclaw_launch.launch import AgentSetup

    if port is None:
        port = plan.master_port + 1 if plan.master_port < 65535 else plan.master_port - 1
    if port == plan.master_port:
        raise click.BadParameter(
            f"{port} is MASTER_PORT; the agents need a port of their own", param_hint="--agent-port"
        )
    python = os.environ.get("PYTHON_EXEC") or sys.executable
    versions = runtime_versions(python, with_gpus=any(r.gpu_uuid for r in plan.ranks))
    options = AgentOptions(
        store_addr=config.nodes[0].ip or plan.master_addr,
        port=port,
        nodes=tuple(n.name for n in config.nodes),
        join_timeout_s=timeout_s,
        keepalive_s=keepalive_s,
        max_restarts=max_restarts,
    )
    return AgentSetup(options=options, fingerprint=fingerprint(config, plan, versions))


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


@cli.command(context_settings=_SCRIPT_LAST)
@_with_common
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (schema 1).")
@click.option("--suggest-parallel", is_flag=True, help="Also list the TP/PP/DP layouts that fit (TP on NVLink first).")
def plan(c: _Common, as_json: bool, suggest_parallel: bool) -> None:
    """Print where each rank would run and with what environment; start nothing."""
    from openclaw_launch.parallel import format_suggestions, suggest_layouts

    try:
        launch_plan = _make_plan(c)
        suggestions = suggest_layouts(_plan_config(c)) if suggest_parallel else None
    except OpenclawError as e:
        _fail(e)
    if as_json:
        doc = launch_plan.to_json()
        if suggestions is not None:
            doc["parallel_suggestions"] = [s.to_json() for s in suggestions]
        click.echo(json.dumps(doc, indent=2))
    else:
        for w in launch_plan.warnings:
            _warn(w)
        click.echo(format_plan_table(launch_plan, warnings=False))
        if suggestions is not None:
            click.echo(format_suggestions(suggestions))


@cli.command(context_settings=_SCRIPT_LAST)
@_with_common
@click.option("--size-mib", type=click.IntRange(min=1), help="All-reduce size (default 1024; CPU ranks 4).")
@click.option("--iters", type=click.IntRange(min=1), help="Timed all-reduces per tier (default 20).")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), help="Save the measured bandwidths here.")
@click.option(
    "--expect",
    "expect_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Expect at least 0.8 x the bandwidths a --record file saved.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the run report (with it).")
def preflight(
    c: _Common,
    size_mib: int | None,
    iters: int | None,
    record_path: str | None,
    expect_path: str | None,
    as_json: bool,
    report_path: str | None,
) -> None:
    """Run the plan with an all-reduce probe: bandwidth per NVLink island and node vs expected."""
    if c.script:
        raise click.UsageError(f"preflight runs its own worker; remove {c.script[0]!r} and what follows")
    from openclaw_launch.config import PreflightSettings
    from openclaw_launch.launch import run_dir_for
    from openclaw_launch.preflight.command import PreflightOptions, run_preflight

    job_id = c.tr.run_id or os.environ.get("SLURM_JOB_ID") or uuid.uuid4().hex[:12]
    tr = dataclasses.replace(c.tr, module=True, no_python=False, run_path=False, run_id=job_id)
    options = PreflightOptions(size_mib, iters, record_path, expect_path, as_json, report_path, c.tr.grace_period_s)
    try:
        settings = load_config(c.config_path).preflight if c.config_path else PreflightSettings()
        code = run_preflight(
            lambda script: _make_plan(dataclasses.replace(c, script=script, tr=tr), job_id, str(run_dir_for(job_id))),
            lambda with_gpus: _topology(c.topology_path, with_gpus),
            settings,
            options,
        )
    except OpenclawError as e:
        _fail(e)
    sys.exit(code)


def _plan_config(c: _Common) -> Config:
    """The config ``plan`` laid out: ``--config``, or this host as ``host_config`` sees it."""
    if c.config_path:
        return load_config(c.config_path)
    from openclaw_launch.topology.discover import host_config

    want = resolve(c.tr, with_config=False)
    return host_config(_topology(c.topology_path, want.nproc_per_node != "cpu"), want.nproc_per_node, want.nnodes or 1)


@cli.command()
@click.option("--snapshot", is_flag=True, help="Write the topology snapshot JSON instead of a config.")
@click.option(
    "--from-smi",
    "from_smi",
    type=click.Path(exists=True, dir_okay=False),
    help="Saved `nvidia-smi topo -m` output to read instead of this host.",
)
@click.option("--smi-list", type=click.Path(exists=True, dir_okay=False), help="Saved `nvidia-smi -L` output (UUIDs).")
@click.option(
    "--numactl-hardware",
    type=click.Path(exists=True, dir_okay=False),
    help="Saved `numactl --hardware` output (NUMA node CPUs).",
)
@click.option("--lscpu", type=click.Path(exists=True, dir_okay=False), help="Saved `lscpu` output (cores, sockets).")
@click.option("--node-name", default=None, help="Node name in the config (default: this host's name).")
@click.option("--ip", default=None, help="Node ip in the config.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
def discover(
    snapshot: bool,
    from_smi: str | None,
    smi_list: str | None,
    numactl_hardware: str | None,
    lscpu: str | None,
    node_name: str | None,
    ip: str | None,
    output: str | None,
) -> None:
    """Describe this host (NVML + sysfs) or saved nvidia-smi text as a config or snapshot."""
    import socket

    from openclaw_launch.topology.discover import config_yaml_from_topology
    from openclaw_launch.topology.snapshot import dump_snapshot

    if output:
        _check_output(output, "--output")
    saved = {"--smi-list": smi_list, "--numactl-hardware": numactl_hardware, "--lscpu": lscpu}
    stray = [flag for flag, value in saved.items() if value and not from_smi]
    if stray:
        raise click.UsageError(
            f"{' and '.join(stray)}: give --from-smi TOPO.txt too (saved outputs describe a saved host, not this one)"
        )
    try:
        if from_smi:
            from openclaw_launch.topology.smi import topology_from_smi_files

            topology = topology_from_smi_files(
                Path(from_smi),
                Path(smi_list) if smi_list else None,
                Path(numactl_hardware) if numactl_hardware else None,
                Path(lscpu) if lscpu else None,
            )
        else:
            topology = _live_topology(True)
        text = (
            json.dumps(dump_snapshot(topology), indent=2) + "\n"
            if snapshot
            else config_yaml_from_topology(topology, node_name or topology.hostname or socket.gethostname(), ip)
        )
    except OpenclawError as e:
        _fail(e)
    if output:
        from openclaw_launch.files import write_atomic

        try:
            write_atomic(output, text)
        except OSError as e:
            raise click.BadParameter(
                f"cannot write {output} ({e.strerror}: {e.filename})", param_hint="--output"
            ) from None
    else:
        click.echo(text, nl=False)


@cli.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
@click.option("--node", help="Which config node this host is.")
@click.option("--topology", "topology_path", type=click.Path(dir_okay=False), help="Snapshot instead of this host.")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def validate(config_path: str, node: str | None, topology_path: str | None, as_json: bool) -> None:
    """Check the config against the machine; exit 0 only if no check failed."""
    from openclaw_launch import validate as checks

    try:
        config = load_config(config_path)
        node_name = _node_name(config, node)
        topology = _topology(topology_path, not config.node(node_name).is_cpu)
        mps = _mps_status(config, node_name)
        results = checks.run_checks(
            config,
            topology,
            node_name,
            numactl_path=shutil.which("numactl"),
            mps=mps,
            mps_pipe_dir=_mps_pipe_dir() if mps is not None else None,
        )
    except OpenclawError as e:
        _fail(e)
    for w in config.warnings:
        _warn(w)
    click.echo(json.dumps(checks.results_to_json(results), indent=2) if as_json else checks.format_results(results))
    sys.exit(checks.exit_code(results))


def _mps_status(config: Config, node_name: str) -> MpsStatus | None:
    """The MPS daemon this host runs now (default pipe directory), when the config enables MPS.

    Its per-device client list numbers devices by the daemon's CUDA_VISIBLE_DEVICES; the
    launcher starts its daemon with the node's GPUs in config (= plan) order, so that order
    names them. A daemon started by hand with another order would be misattributed.
    """
    node = config.node(node_name)
    if not config.runtime.enable_mps or node.is_cpu:
        return None
    from openclaw_launch.mps import mps_status

    return mps_status(_mps_pipe_dir(), None, gpu_uuids=[g.uuid for g in node.gpus])


def _mps_pipe_dir() -> str:
    """The system MPS daemon's pipe directory, the one `validate` checks."""
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


@cli.command()
@click.argument("run_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw it (PNG) here; needs matplotlib.")
def report(run_json: str, plot_path: str | None) -> None:
    """Render a saved run report."""
    from openclaw_launch.report import format_report, load_report

    try:
        data = load_report(run_json)
        click.echo(format_report(data))
        if plot_path is not None:
            from openclaw_launch.stats.plot import plot_report

            plot_report(data, plot_path)
    except OpenclawError as e:
        _fail(e)


def _standard_streams() -> None:
    """Started with fd 0, 1 or 2 closed (``2>&-``): /dev/null in their place, so no file we open
    becomes a worker's stderr and no message raises."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the process's stdout, open until exit
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def main() -> None:
    """Every usage error is one line on stderr and exit 2, before anything starts (no click banner).
    Ctrl-C before the job's signal handling is in place exits 130, as a shell expects."""
    try:
        _standard_streams()
        _main()
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("openclaw-launch: interrupted\n")
        sys.exit(130)
    except OSError as e:  # our own output failed (`plan --json > /dev/full`, a closed pipe)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more can reach the old one
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"openclaw-launch: error: cannot write the output: {e.strerror or e}\n")
        sys.exit(1)


def _main() -> None:
    try:
        rv = cli.main(prog_name="openclaw-launch", standalone_mode=False)
    except click.UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare command: its help (click >= 8.2)
            click.echo(e.format_message(), err=True)
            sys.exit(2)
        hint = f" (see openclaw-launch {e.ctx.info_name} --help)" if e.ctx and e.ctx.parent else ""
        click.echo(f"openclaw-launch: error: {e.format_message()}{hint}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        click.echo(f"openclaw-launch: error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except click.Abort:
        sys.exit(130)
    except OpenclawError as e:  # raised outside a command's own handler
        _fail(e)
    sys.exit(rv if isinstance(rv, int) else 0)
