"""What the commands share: the options of ``run``, ``plan`` and ``preflight`` (one ``Common``),
their inputs (config, topology), the command's run context and the plan built from them, and how a
command fails or warns.

The command bodies are in ``cli/run.py`` (``run``) and ``cli/tools.py`` (the others; ``run``'s own
options, which ``plan`` takes too, are ``cli/run_options.py``); ``cli/main.py`` is the group.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click

from openclaw_launch.agents.membership import ElasticSpec
from openclaw_launch.cli.torchrun_compat import FLAGS, TorchrunArgs
from openclaw_launch.cli.torchrun_resolve import Resolved, node_by_rank, resolve, script_args
from openclaw_launch.config.model import BindingPolicy, Config
from openclaw_launch.config.parallel import PARALLEL_DIMS, ParallelSpec
from openclaw_launch.config.reader import load_config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import RUN_ID_PLACEHOLDER, RunContext, free_port, run_context, run_id_for
from openclaw_launch.plan.env import worker_python
from openclaw_launch.plan.model import ElasticRange, Entry, EntryKind, LaunchPlan, PlanOptions
from openclaw_launch.topology.model import Topology

if TYPE_CHECKING:
    from openclaw_launch.cli.run_options import RunOptions


def fail(err: OpenclawError) -> NoReturn:
    click.echo(f"openclaw-launch: {err}", err=True)
    sys.exit(err.exit_code)


def warn(message: str) -> None:
    click.echo(f"openclaw-launch: warning: {message}", err=True)


def echo_err(text: str) -> None:
    """A line of the launcher's own on stderr (what the agents say while the nodes meet)."""
    click.echo(text, err=True)


def stopped_meeting(signum: int) -> NoReturn:
    """A signal while the nodes met, before the plan: nothing started; exit 128+N, as for a job."""
    click.echo(f"openclaw-launch: stopped by signal {signum} while the nodes met; started nothing", err=True)
    sys.exit(128 + signum)


def live_topology(with_gpus: bool, nvml_facts: bool = True) -> Topology:
    """Read this host; NVML is only touched when GPUs are wanted and, with ``nvml_facts`` False
    (no NVLink needed), not even then where the driver's /proc files list the GPUs: start-up time."""
    from openclaw_launch.topology.live import discover_topology
    from openclaw_launch.topology.nvml import no_gpus

    return discover_topology(nvml=None if with_gpus else no_gpus(), nvml_facts=nvml_facts)


def read_topology(snapshot: str | None, with_gpus: bool, nvml_facts: bool = True) -> Topology:
    if snapshot:
        from openclaw_launch.topology.snapshot import load_snapshot

        return load_snapshot(Path(snapshot))
    return live_topology(with_gpus, nvml_facts)


@dataclass(frozen=True)
class Inputs:
    """What a command reads once: its torchrun flags resolved, its ``--config`` file and its host
    (or ``--topology`` snapshot). An elastic job plans every later world from these, as it planned
    the first: the YAML is not read again, nor the host."""

    want: Resolved
    config: Config | None  # the whole --config (a world's plan narrows it to the world's nodes); None: none
    topology_path: str | None
    _topologies: dict[tuple[bool, bool], Topology] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def topology(self, with_gpus: bool, nvml_facts: bool) -> Topology:
        """The host as ``read_topology`` gives it, read the first time it is asked for."""
        key = (with_gpus, nvml_facts)
        if key not in self._topologies:
            self._topologies[key] = read_topology(self.topology_path, with_gpus, nvml_facts)
        return self._topologies[key]


def read_inputs(c: Common) -> Inputs:
    """The command line's inputs: a refused flag raises ``click.BadParameter``, a bad config
    ``ConfigError``."""
    want = resolve(c.tr, with_config=bool(c.config_path))
    return Inputs(want, load_config(c.config_path) if c.config_path else None, c.topology_path)


def plan_and_config(
    c: Common,
    inputs: Inputs,
    *,
    at_run: bool,
    run: RunOptions | None = None,
    arrival: tuple[int, int] | None = None,
    elastic: ElasticSpec | None = None,
    world_nodes: int | None = None,
    world_names: tuple[str, ...] | None = None,
    context: RunContext | None = None,
) -> tuple[LaunchPlan, Config]:
    """The plan for the command line (``--config``, or this host as torchrun would see it), built
    with the command's one ``RunContext`` from its ``inputs``. ``at_run``: a launcher that will start
    it (``run``, ``preflight``), else what ``plan`` and ``run --dry-run`` show, with the placeholders
    of docs/plan-format.md for what only a running launcher knows. ``run``: the ``run`` options that
    change what a rank runs (``--telemetry``, ``--hang-timeout-s``, ``--stats-interval-s``); None: no
    telemetry (preflight's probe). ``arrival``: node ranks by arrival (c10d without ``--node-rank``),
    the (node rank, MASTER_PORT) this launcher's rendezvous gave; None there: node rank 0's plan, with
    ``NODE_RANK_PLACEHOLDER``'s warning. ``elastic``: an elastic job's node range, which its plan
    carries (one world's plan). One of its worlds: ``world_nodes`` nodes (with ``--config``: the
    config's ``world_names``, in node-rank order), and the ``context`` of its first plan (the run id
    and directory stay)."""
    want = inputs.want
    if want.by_arrival and at_run and arrival is None:  # preflight: its probe has no rendezvous
        raise click.UsageError(
            "node ranks by arrival (c10d without --node-rank) are given to run only; give preflight --node-rank K"
        )
    node_rank = arrival[0] if arrival else want.node_rank
    entry = _entry(c.script or ("train.py",), c.tr)  # plan: the script only shows in argv
    if c.config_path:
        if want.nproc_per_node is not None:
            raise click.UsageError(
                "--nproc-per-node (or PET_NPROC_PER_NODE) is for runs without --config; the config sets the ranks"
            )
        assert inputs.config is not None
        config = inputs.config  # its warnings come back in the plan's
        if world_names:  # an elastic job's world: those nodes, in its order
            config = dataclasses.replace(config, nodes=tuple(config.node(name) for name in world_names))
        node_name = node_by_rank(config, want.nnodes, want.node_rank, c.node) or node_name_for(config, c.node)
        _check_slurm_gpus(config, node_name, c.topology_path)
        node = config.node(node_name)  # NVLinks only to check the peers it lists
        topology = inputs.topology(not node.is_cpu, any(g.nvlink_peers for g in node.gpus))
    else:
        if c.node is not None:
            raise click.UsageError("--node names a node of --config; without --config use --nnodes and --node-rank")
        from openclaw_launch.config.discover import host_config

        # host_config makes this host's NVLinks the GPUs' peers, which only TP groups use
        topology = inputs.topology(want.nproc_per_node != "cpu", (c.tp or 1) > 1)
        config = host_config(topology, want.nproc_per_node, world_nodes or want.nnodes or 1)
        node_name = config.nodes[node_rank or 0].name
    if want.binding:
        config = dataclasses.replace(
            config, runtime=dataclasses.replace(config.runtime, binding=cast(BindingPolicy, want.binding))
        )
    options = PlanOptions(
        entry=entry,
        node=node_name,
        python=worker_python(os.environ),
        base_env=dict(os.environ),
        master_addr=want.master_addr,
        master_port=None if want.by_arrival else want.master_port,  # by arrival: node rank 0's (the context's)
        max_restarts=c.tr.max_restarts,
        numactl=shutil.which("numactl"),
        strictness=c.strictness,
        telemetry_mode=run.telemetry if run else "off",
        hang_timeout_s=run.hang_timeout_s if run else None,
        stats_interval_s=run.stats_interval_s if run else None,
        role=c.tr.role,
        signals_to_handle=",".join(want.signals),
        virtual_local_rank=c.tr.virtual_local_rank,
        parallel=ParallelSpec(c.tp, c.pp, c.dp, where={d: f"--{d}" for d in PARALLEL_DIMS if getattr(c, d)}),
        fallback_master_addr=_slurm_first_host() if len(config.nodes) > 1 else None,
        elastic=ElasticRange(elastic.min_nodes, elastic.max_nodes) if elastic else None,
        prewarm=c.prewarm,
    )
    if context is None:  # elastic: the job's id is a several-node job's at every size (every node has the same)
        nodes_for_id = elastic.max_nodes if elastic else len(config.nodes)
        context = command_context(c, nodes_for_id, at_run, want.by_arrival, arrival[1] if arrival else None)
    return build_plan(config, topology, context, options), config


def command_context(
    c: Common, nnodes: int, at_run: bool, by_arrival: bool = False, arrival_port: int | None = None
) -> RunContext:
    """The command's run facts, once: the run id (drawn for a one-node run that has none), the
    launcher's pid in the run directory, a free port for a one-node job (by arrival: node rank 0's
    port, ``arrival_port``)."""
    import tempfile
    import uuid

    drawn = uuid.uuid4().hex[:12] if at_run else RUN_ID_PLACEHOLDER
    run_id = run_id_for(c.tr.run_id, os.environ.get("SLURM_JOB_ID"), nnodes, drawn)
    return run_context(
        run_id,
        tempfile.gettempdir(),
        os.getpid() if at_run else None,
        c.tr.log_dir,
        arrival_port if by_arrival else free_port() if at_run and nnodes == 1 else None,
        by_arrival,
    )


def _slurm_first_host() -> str | None:
    """The first host Slurm allocated to this step (or job): the multi-node MASTER_ADDR default."""
    text = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not text:
        return None
    from openclaw_launch.agents.hostlist import expand_hostlist

    hosts = expand_hostlist(text)
    return hosts[0] if hosts else None


def node_name_for(config: Config, cli_node: str | None) -> str:
    from openclaw_launch.agents.identity import local_identity, resolve_node

    if cli_node is None and len(config.nodes) > 1 and "SLURM_NODEID" not in os.environ:
        names, addrs = local_identity()
        return resolve_node(config, None, os.environ, names, addrs)
    return resolve_node(config, cli_node, os.environ)


def _entry(script: tuple[str, ...], tr: TorchrunArgs) -> Entry:
    """What each worker runs; ``--run-path`` runs the script as __main__ like ``python -u script``."""
    if not script:
        raise click.UsageError("give the training script (or -m MODULE, or --no-python COMMAND) to run")
    kind: EntryKind = "script" if tr.run_path else "module" if tr.module else "exec" if tr.no_python else "script"
    return Entry(kind=kind, target=script[0], args=script_args(tuple(script[1:])))


@dataclass(frozen=True)
class Common:
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
    prewarm: tuple[str, ...] = ()  # --prewarm: the zygote's modules (plan/prewarm.py)


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
    click.option(
        "--prewarm",
        callback=lambda _ctx, _param, value: _prewarm_modules(value),
        help="Import these modules (e.g. torch, or torch,numpy) once in a zygote process and fork every worker of "
        "every attempt from it: a restart's workers skip the imports. Python entries only; config "
        "runtime.prewarm; docs/plan-format.md.",
    ),
    *(flag.option() for flag in FLAGS),
    click.argument("script", nargs=-1, type=click.UNPROCESSED),
]


def _prewarm_modules(value: str | None) -> tuple[str, ...]:
    from openclaw_launch.config.prewarm import prewarm_modules

    try:
        return prewarm_modules(value) if value is not None else ()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--prewarm") from None


def with_common(f: Callable[..., None]) -> Callable[..., None]:
    """Add the shared options and hand them to ``f`` as one ``Common``."""

    @functools.wraps(f)
    def wrapper(**kw: Any) -> None:
        tr = TorchrunArgs(**{name: kw.pop(name) for name in TorchrunArgs.__dataclass_fields__})
        mine = {name: kw.pop(name) for name in Common.__dataclass_fields__ if name != "tr"}
        f(Common(**mine, tr=tr), **kw)

    for option in reversed(_common_options):
        wrapper = option(wrapper)
    return wrapper


class ScriptLast(click.Command):
    """A command whose options end at the script, as torchrun's: everything after the script goes
    to it untouched, and before it a long option may be shortened as argparse allows (to a prefix
    that begins one option string only: ``--nnode``; ``--nproc`` begins both spellings of
    --nproc-per-node and is ambiguous, as under torchrun); an unknown one is an error with a "did
    you mean". The rule holds for every command built on it (run, the default command, plan,
    preflight)."""

    allow_interspersed_args = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._spelled_out(ctx, args))

    def _spelled_out(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``args`` with each abbreviated long option before the script written in full."""
        options = {
            name: param
            for param in self.get_params(ctx)
            if isinstance(param, click.Option)
            for name in (*param.opts, *param.secondary_opts)
        }
        spelled = list(args)
        at = 0
        while at < len(spelled) and spelled[at].startswith("-") and spelled[at] not in ("-", "--"):
            name, equals, value = spelled[at].partition("=")
            if name.startswith("--") and name not in options:
                name = _long_option(name, options)
                spelled[at] = name + equals + value
            option = options.get(name)
            takes_value = option is not None and not option.is_flag and not option.count and not equals
            at += 1 + (option.nargs if option is not None and takes_value else 0)
        return spelled


def _long_option(prefix: str, options: dict[str, click.Option]) -> str:
    """The one long option ``prefix`` begins, looked for among torchrun's spellings first (so a
    torchrun line means what it means under torchrun: ``--stand`` is --standalone, not our
    --standby); itself when none begins with it (click then says "no such option" and what was
    meant)."""
    torchrun = [name for flag in FLAGS for name in flag.torchrun if name.startswith(prefix)]
    candidates = torchrun or [name for name in options if name.startswith(prefix)]
    if len(candidates) > 1:
        raise click.UsageError(f"ambiguous option: {prefix} could match {', '.join(candidates)}")
    return candidates[0] if candidates else prefix


def check_output_option(path: str, option: str) -> None:
    """An output path that cannot be written is a usage error now, not after the job."""
    from openclaw_launch.files import check_output_path

    problem = check_output_path(path)
    if problem:
        raise click.BadParameter(f"cannot write there: {problem}; give a writable file path", param_hint=option)


def _check_slurm_gpus(config: Config, node_name: str, topology_path: str | None) -> None:
    """Under a Slurm GPU allocation on this host, the config node's GPUs must be the allocated ones."""
    if topology_path or not ("SLURM_STEP_GPUS" in os.environ or "SLURM_JOB_GPUS" in os.environ):
        return
    from openclaw_launch.agents.slurm_gpus import slurm_gpu_problems
    from openclaw_launch.errors import PlanError

    problems = slurm_gpu_problems(config.node(node_name), os.environ)
    if problems:
        raise PlanError("; ".join(problems))
