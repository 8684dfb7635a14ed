"""Command line: ``run`` (the default), ``plan``, ``discover``, ``validate``, ``report``.

Thin: parse options, gather inputs (config, topology), call the pure planner,
hand the plan to the effects (MPS, supervisor). Every user error exits 2 with
one message and no traceback, before anything is started.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from openclaw_launch.config import Config, load_config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan import Entry, EntryKind, LaunchPlan, PlanOptions, build_plan, format_plan_table
from openclaw_launch.topology.model import Topology

if TYPE_CHECKING:
    from openclaw_launch.mps import MpsStatus

SUBCOMMANDS = ("run", "plan", "discover", "validate", "report")


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
    run_id: str = "none",
    max_restarts: int = 0,
    error_file_dir: str | None = None,
    telemetry_socket: str | None = None,
    telemetry_hooks: bool = True,
) -> LaunchPlan:
    entry = _entry(c.script or ("train.py",), c.module, c.no_python)
    if c.config_path:
        if c.nproc_per_node is not None:
            raise click.UsageError("--nproc-per-node is for runs without --config; the config sets the ranks")
        config = load_config(c.config_path)  # its warnings come back in the plan's
        node_name = _node_name(config, c.node)
        topology = _topology(c.topology_path, not config.node(node_name).is_cpu)
    else:
        if c.node is not None:
            raise click.UsageError("--node names a node of --config; without --config the only node is this host")
        from openclaw_launch.topology.discover import host_config

        topology = _topology(c.topology_path, True)
        config = host_config(topology, c.nproc_per_node)
        node_name = "localhost"
    options = PlanOptions(
        entry=entry,
        node=node_name,
        python=sys.executable,
        base_env=dict(os.environ),
        run_id=run_id,
        master_addr=c.master_addr,
        master_port=c.master_port,
        max_restarts=max_restarts,
        error_file_dir=error_file_dir,
        numactl=shutil.which("numactl"),
        strictness=c.strictness,
        telemetry_socket=telemetry_socket,
        telemetry_hooks=telemetry_hooks,
    )
    return build_plan(config, topology, options)


def _node_name(config: Config, cli_node: str | None) -> str:
    from openclaw_launch.multinode import local_identity, resolve_node

    if cli_node is None and len(config.nodes) > 1 and "SLURM_NODEID" not in os.environ:
        names, addrs = local_identity()
        return resolve_node(config, None, os.environ, names, addrs)
    return resolve_node(config, cli_node, os.environ)


def _entry(script: tuple[str, ...], module: bool, no_python: bool) -> Entry:
    if not script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    if module and no_python:
        raise click.UsageError("-m and --no-python exclude each other")
    kind: EntryKind = "module" if module else "exec" if no_python else "script"
    return Entry(kind=kind, target=script[0], args=tuple(script[1:]))


class _DefaultRun(click.Group):
    """``openclaw-launch [run options] train.py`` is ``openclaw-launch run ...`` (torchrun's shape)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in SUBCOMMANDS and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_DefaultRun, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="openclaw-launch")
def cli() -> None:
    """Topology-aware launcher: every rank on its GPU by UUID, on that GPU's NUMA node.

    Run a job as with torchrun: `openclaw-launch [OPTIONS] train.py [ARGS]...` is
    `openclaw-launch run ...` (see `openclaw-launch run --help`).
    """


@dataclass(frozen=True)
class _Common:
    """What ``run`` and ``plan`` share: where the ranks come from and what they run."""

    config_path: str | None
    node: str | None
    topology_path: str | None
    nproc_per_node: int | None
    module: bool
    no_python: bool
    master_addr: str | None
    master_port: int | None
    strictness: str | None
    script: tuple[str, ...]


_common_options = [
    click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Cluster YAML."),
    click.option("--node", help="Which config node this launcher is (default: Slurm, or matched to this host)."),
    click.option(
        "--topology",
        "topology_path",
        type=click.Path(dir_okay=False),
        help="Topology snapshot JSON to use instead of this host (discover --snapshot).",
    ),
    click.option(
        "--nproc-per-node",
        type=click.IntRange(min=1),
        help="Without --config: ranks on this host (GPUs, or CPU workers when there is no GPU).",
    ),
    click.option("-m", "--module", is_flag=True, help="Run the target as a Python module (python -m)."),
    click.option("--no-python", is_flag=True, help="Run the target as a command, not a Python script."),
    click.option("--master-addr", help="Rendezvous address (default: config, else first node's ip)."),
    click.option("--master-port", type=click.IntRange(1, 65535), help="Rendezvous port (default 29500)."),
    click.option(
        "--strictness",
        type=click.Choice(["fail", "warn"]),
        help="Bus id / NUMA / NVLink mismatches fail the launch or only warn.",
    ),
    click.argument("script", nargs=-1, type=click.UNPROCESSED),
]


def _with_common(f: Callable[..., None]) -> Callable[..., None]:
    """Add the shared options and hand them to ``f`` as one ``_Common``."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> None:
        common = _Common(**{name: kw.pop(name) for name in _Common.__dataclass_fields__})
        f(common, **kw)

    for option in reversed(_common_options):
        wrapper = option(wrapper)
    return wrapper


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_with_common
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Restart the node's whole group this many times after a failure.",
)
@click.option(
    "--restart-backoff-s",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Wait before restart k: this times 2**k (at most 30 s).",
)
@click.option(
    "--grace-period-s",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="After SIGTERM, how long workers get before SIGKILL.",
)
@click.option(
    "--kill-timeout-s",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="After SIGKILL, how long to wait for workers stuck in the kernel before giving up.",
)
@click.option("--log-dir", type=click.Path(file_okay=False), help="Per-rank logs under DIR/<run-id>/attempt-N/rank-R/.")
@click.option(
    "--console-ranks", default="all", show_default=True, help="Ranks shown on the console: all, none, or 0,3-5."
)
@click.option(
    "--prefix",
    "prefix_template",
    default="[rank {rank}] ",
    show_default=True,
    help="Console line prefix; fields {rank}, {local_rank}, {node}.",
)
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the run report JSON here.")
@click.option("--run-id", help="Job id shared by all nodes (default: $SLURM_JOB_ID under Slurm, else random).")
@click.option(
    "--telemetry",
    type=click.Choice(["hooks", "api", "off"]),
    default="hooks",
    show_default=True,
    help="Per-step statistics: hooks = zero-code torch hooks plus the telemetry API; api = only "
    "telemetry.step()/section(); off = none (no statistics, no straggler verdict).",
)
@click.option(
    "--stats-interval-s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Print a one-line straggler summary this often while the job runs (0 = never).",
)
@click.option(
    "--straggler-threshold-pct",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Name a straggler when one rank is busy this % of the median step longer than the others.",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option("--standalone", is_flag=True, hidden=True, help="Accepted for torchrun compatibility.")
def run(
    c: _Common,
    max_restarts: int,
    restart_backoff_s: float,
    grace_period_s: float,
    kill_timeout_s: float,
    log_dir: str | None,
    console_ranks: str,
    prefix_template: str,
    report_path: str | None,
    run_id: str | None,
    telemetry: str,
    stats_interval_s: float,
    straggler_threshold_pct: float,
    dry_run: bool,
    standalone: bool,
) -> None:
    """Run SCRIPT [ARGS...] on every planned rank and supervise it."""
    del standalone  # accepted for torchrun compatibility: one launcher per node is always standalone
    if not c.script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    from openclaw_launch.launch import StatsOptions, launch, run_dir_for
    from openclaw_launch.supervise import SuperviseOptions

    job_id = run_id or os.environ.get("SLURM_JOB_ID") or uuid.uuid4().hex[:12]
    ranks_shown = _console_ranks(console_ranks)
    run_dir = run_dir_for(job_id)
    socket_path = None if telemetry == "off" else str(run_dir / "telemetry.sock")
    try:
        plan = _make_plan(c, job_id, max_restarts, str(run_dir / "errors"), socket_path, telemetry == "hooks")
    except OpenclawError as e:
        _fail(e)
    for w in plan.warnings:
        _warn(w)
    if dry_run:
        click.echo(format_plan_table(plan, warnings=False))
        return
    options = SuperviseOptions(
        grace_period_s=grace_period_s,
        kill_timeout_s=kill_timeout_s,
        max_restarts=max_restarts,
        restart_backoff_s=restart_backoff_s,
        log_dir=log_dir,
        console_ranks=ranks_shown,
        prefix_template=prefix_template,
    )
    try:
        stats = StatsOptions(interval_s=stats_interval_s, threshold_pct=straggler_threshold_pct)
        code = launch(plan, options, report_path=report_path, stats=stats)
    except OpenclawError as e:
        _fail(e)
    sys.exit(code)


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


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_with_common
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (schema 1).")
def plan(c: _Common, as_json: bool) -> None:
    """Print where each rank would run and with what environment; start nothing."""
    try:
        launch_plan = _make_plan(c)
    except OpenclawError as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(launch_plan.to_json(), indent=2))
    else:
        for w in launch_plan.warnings:
            _warn(w)
        click.echo(format_plan_table(launch_plan, warnings=False))


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
        results = checks.run_checks(config, topology, node_name, numactl_path=shutil.which("numactl"), mps=mps)
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

    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    return mps_status(pipe_dir, None, gpu_uuids=[g.uuid for g in node.gpus])


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


def main() -> None:
    try:
        cli(prog_name="openclaw-launch")
    except OpenclawError as e:  # raised outside a command's own handler
        _fail(e)
