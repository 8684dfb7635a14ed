"""The commands besides ``run``: ``plan``, ``preflight``, ``discover``, ``validate``, ``report``,
``compare``."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from openclaw_launch.cli.common import (
    Common,
    Inputs,
    ScriptLast,
    check_output_option,
    fail,
    live_topology,
    node_name_for,
    plan_and_config,
    read_inputs,
    read_topology,
    warn,
    with_common,
)
from openclaw_launch.cli.option_types import slow_percent
from openclaw_launch.cli.replica_groups import replica_groups
from openclaw_launch.cli.run_options import RunOptions, console_choices, startup_timeout_s, with_run_options
from openclaw_launch.config.defaults import PREFLIGHT_ITERS, PREFLIGHT_SIZE_MIB, PREFLIGHT_SLOW_PCT
from openclaw_launch.config.model import Config
from openclaw_launch.config.reader import load_config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.format import format_plan_table
from openclaw_launch.plan.replica_groups import format_replica_groups
from openclaw_launch.preflight.tiers import RECORDED_MARGIN

if TYPE_CHECKING:
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.preflight.command import PreflightOptions
    from openclaw_launch.run.mps.status import MpsStatus
    from openclaw_launch.run.supervise import SuperviseOptions


@click.command(cls=ScriptLast)
@with_common
@with_run_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON (schema 1).")
@click.option("--suggest-parallel", is_flag=True, help="Also list the TP/PP/DP layouts that fit (TP on NVLink first).")
def plan(c: Common, r: RunOptions, as_json: bool, suggest_parallel: bool) -> None:
    """Print exactly what `run` with these options would execute on each rank (argv, environment,
    binding); start nothing. Takes every `run` option."""
    from openclaw_launch.cli.elastic import elastic_job
    from openclaw_launch.cli.exclude import exclude_file
    from openclaw_launch.cli.straggler import straggler_settings
    from openclaw_launch.plan.parallel import format_suggestions, suggest_layouts

    try:
        inputs = read_inputs(c)
    except OpenclawError as e:
        fail(e)
    console_choices(r, c.tr.role, inputs.want.local_ranks_shown is not None, os.environ)  # bad values: exit 2, as run
    try:
        elastic = elastic_job(c, inputs, r)  # --standby misuse: exit 2, as run
        straggler_settings(r, inputs.config.runtime if inputs.config else None, elastic, c.tr.max_restarts)
        exclude_file(r, inputs, elastic)  # --exclude-file: exit 2 as run
        launch_plan, config = plan_and_config(
            c,
            inputs,
            at_run=False,
            run=r,
            elastic=elastic.spec if elastic else None,
        )
        startup_timeout_s(r, config.runtime.startup_timeout_s, launch_plan.hang_timeout_s)  # exit 2 as run
        groups = replica_groups(c, inputs, r, launch_plan, config, at_run=False)
        suggestions = suggest_layouts(config) if suggest_parallel else None
    except OpenclawError as e:
        fail(e)
    if elastic is not None:
        warn(
            f"elastic job ({elastic.spec.text} nodes): this is the plan in a world of {launch_plan.nnodes} node(s); "
            "run builds each world's own when its nodes meet: WORLD_SIZE, GROUP_WORLD_SIZE and the node ranks "
            "(RANK with them) follow the membership"
        )
    if as_json:
        doc = groups.to_json() if groups is not None else launch_plan.to_json()
        if suggestions is not None:
            doc["parallel_suggestions"] = [s.to_json() for s in suggestions]
        click.echo(json.dumps(doc, indent=2))
    else:
        for w in launch_plan.warnings:
            warn(w)
        click.echo(format_replica_groups(groups) if groups else format_plan_table(launch_plan, warnings=False))
        if suggestions is not None:
            click.echo(format_suggestions(suggestions))


@click.command(cls=ScriptLast)
@with_common
@click.option(
    "--size-mib",
    type=click.IntRange(min=1),
    help=f"All-reduce size (default {PREFLIGHT_SIZE_MIB['gpu']}; CPU ranks {PREFLIGHT_SIZE_MIB['cpu']}).",
)
@click.option("--iters", type=click.IntRange(min=1), help=f"Timed all-reduces per tier (default {PREFLIGHT_ITERS}).")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), help="Save the measured bandwidths here.")
@click.option(
    "--expect",
    "expect_path",
    type=click.Path(exists=True, dir_okay=False),
    help=f"Expect at least {RECORDED_MARGIN:g} x the bandwidths a --record file saved.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), help="Write the run report (with it).")
@click.option(
    "--slow-pct",
    type=slow_percent(),
    help="A GEMM or node pair this many percent below its reference is slow, its node excluded "
    f"(default {PREFLIGHT_SLOW_PCT['gpu']:g} on GPUs, {PREFLIGHT_SLOW_PCT['cpu']:g} on CPU ranks).",
)
@click.option(
    "--exclude-file",
    "exclude_path",
    type=click.Path(dir_okay=False),
    help="Write the nodes to leave out here, as a Slurm hostlist for sbatch --exclude (exit 4 when any).",
)
@click.option(
    "--scope",
    type=click.Choice(["job", "node"]),
    default="job",
    show_default=True,
    help="job: every node of the job at once (GEMMs compared, node pairs); node: this node alone.",
)
def preflight(
    c: Common,
    size_mib: int | None,
    iters: int | None,
    record_path: str | None,
    expect_path: str | None,
    as_json: bool,
    report_path: str | None,
    slow_pct: float | None,
    exclude_path: str | None,
    scope: str,
) -> None:
    """Run the plan with a probe: all-reduce per NVLink island and node vs expected, a GEMM per GPU,
    an all-reduce per node pair; name the nodes to exclude."""
    if c.script:
        raise click.UsageError(f"preflight runs its own worker; remove {c.script[0]!r} and what follows")
    from openclaw_launch.preflight.command import PreflightOptions

    options = PreflightOptions(
        size_mib,
        iters,
        record_path,
        expect_path,
        as_json,
        report_path,
        c.tr.grace_period_s,
        slow_pct=slow_pct,
        exclude_path=exclude_path,
        scope=scope,
        host_names=not c.config_path,
    )
    try:
        code = probe_fabric(c, read_inputs(c), options)
    except OpenclawError as e:
        fail(e)
    sys.exit(code)


def probe_fabric(c: Common, inputs: Inputs, options: PreflightOptions) -> int:
    """Preflight with the plan of this command line (config, node, layout, environment, MPS; no
    telemetry); the exit code of docs/preflight.md. ``preflight`` and ``run --preflight`` both come here."""
    from openclaw_launch.config.model import PreflightSettings
    from openclaw_launch.preflight.command import run_preflight

    tr = dataclasses.replace(c.tr, module=True, no_python=False, run_path=False)
    settings = inputs.config.preflight if inputs.config is not None else PreflightSettings()
    return run_preflight(
        lambda script: plan_and_config(dataclasses.replace(c, script=script, tr=tr), inputs, at_run=True)[0],
        lambda with_gpus: inputs.topology(with_gpus, True),
        settings,
        options,
        _launch_probe,
    )


def _launch_probe(plan: LaunchPlan, supervise: SuperviseOptions, report_path: str | None, verdict: Any) -> int:
    """The probe's plan, run as a job is (job/launch.py); its verdict goes into the run report."""
    from openclaw_launch.job.launch import launch

    return launch(plan, supervise, report_path=report_path, preflight=verdict)


@click.command()
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

    from openclaw_launch.config.discover import config_yaml_from_topology
    from openclaw_launch.topology.snapshot import dump_snapshot

    if output:
        check_output_option(output, "--output")
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
            topology = live_topology(True)
        text = (
            json.dumps(dump_snapshot(topology), indent=2) + "\n"
            if snapshot
            else config_yaml_from_topology(topology, node_name or topology.hostname or socket.gethostname(), ip)
        )
    except OpenclawError as e:
        fail(e)
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


def _gpu_memory_mib(uuids: list[str]) -> dict[str, float]:
    """Each GPU's used memory now, as an elastic job reads it after a failed attempt (run/gpu_memory.py);
    none without NVML."""
    from openclaw_launch.run.gpu_memory import memory_reader

    if not uuids:
        return {}
    try:
        return memory_reader(os.environ).used_mib(uuids)
    except Exception:  # no NVML here (no driver, no pynvml): the check is left out
        return {}


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False))
@click.option("--node", help="Which config node this host is.")
@click.option("--topology", "topology_path", type=click.Path(dir_okay=False), help="Snapshot instead of this host.")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def validate(config_path: str, node: str | None, topology_path: str | None, as_json: bool) -> None:
    """Check the config against the machine, and show this node's fingerprint; exit 0 only if no
    check failed."""
    from openclaw_launch.codec import to_json
    from openclaw_launch.topology.live import HOST_ROOT
    from openclaw_launch.validate.fingerprint import format_fingerprint, node_fingerprint
    from openclaw_launch.validate.host import run_checks
    from openclaw_launch.validate.results import exit_code, format_results, validate_report

    try:
        config = load_config(config_path)
        node_name = node_name_for(config, node)
        topology = read_topology(topology_path, not config.node(node_name).is_cpu)
        mps = _mps_status(config, node_name)
        results = run_checks(
            config,
            topology,
            node_name,
            numactl_path=shutil.which("numactl"),
            mps=mps,
            mps_pipe_dir=_mps_pipe_dir() if mps is not None else None,
            gpu_memory_mib=_gpu_memory_mib([g.uuid for g in config.node(node_name).gpus]),
        )
        from openclaw_launch.plan.env import worker_python

        python = worker_python(os.environ)
        fp = node_fingerprint(config, node_name, topology, os.environ, HOST_ROOT, python)
    except OpenclawError as e:
        fail(e)
    for w in config.warnings:
        warn(w)
    if as_json:
        shown = {"fingerprint": fp} if isinstance(fp, dict) else {"fingerprint": None, "fingerprint_error": fp}
        click.echo(json.dumps({**to_json(validate_report(results)), **shown}, indent=2))
    else:
        click.echo(format_results(results) + "\n" + format_fingerprint(fp))
    sys.exit(exit_code(results))


def _mps_status(config: Config, node_name: str) -> MpsStatus | None:
    """The MPS daemon this host runs now (default pipe directory), when the config enables MPS.

    Its per-device client list numbers devices by the daemon's CUDA_VISIBLE_DEVICES; the
    launcher starts its daemon with the node's GPUs in config (= plan) order, so that order
    names them. A daemon started by hand with another order would be misattributed.
    """
    node = config.node(node_name)
    if not config.runtime.enable_mps or node.is_cpu:
        return None
    from openclaw_launch.run.mps.status import mps_status

    return mps_status(_mps_pipe_dir(), None, gpu_uuids=[g.uuid for g in node.gpus])


def _mps_pipe_dir() -> str:
    """The system MPS daemon's pipe directory, the one `validate` checks."""
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")


@click.command()
@click.argument("run_json", type=click.Path(exists=True, dir_okay=False))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw it (PNG) here; needs matplotlib.")
def report(run_json: str, plot_path: str | None) -> None:
    """Render a saved run report."""
    from openclaw_launch.report.build import load_report
    from openclaw_launch.report.format import format_report

    try:
        data = load_report(run_json)
        click.echo(format_report(data))
        if plot_path is not None:
            from openclaw_launch.report.plot import plot_report

            plot_report(data, plot_path)
    except OpenclawError as e:
        fail(e)


@click.command()
@click.argument("base_json", type=click.Path(dir_okay=False))
@click.argument("new_json", type=click.Path(dir_okay=False))
def compare(base_json: str, new_json: str) -> None:
    """What changed between two reports of the same job: step time, the rank and phase that explain
    it, the verdicts, GPU clocks and throttle reasons (docs/report-format.md)."""
    from openclaw_launch.report.build import load_report
    from openclaw_launch.report.compare import compare_reports

    try:
        click.echo("\n".join(compare_reports(load_report(base_json), load_report(new_json))))
    except OpenclawError as e:
        fail(e)
