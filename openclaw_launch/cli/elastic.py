"""``run`` with ``--nnodes MIN:MAX`` (or ``--standby``): the first world from the rendezvous before the
plan is built, and the agent that re-forms it (agents/elastic_agent.py) with a ``replan`` that builds
the same pure plan for node rank k of n, on the first plan's run context."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from openclaw_launch.agents.membership import ElasticSpec
from openclaw_launch.cli.common import Common, fail, node_name_for, plan_and_config
from openclaw_launch.cli.run_options import RunOptions
from openclaw_launch.cli.torchrun_resolve import Resolved
from openclaw_launch.config.defaults import MASTER_PORT
from openclaw_launch.config.model import Config
from openclaw_launch.errors import OpenclawError

if TYPE_CHECKING:
    from openclaw_launch.agents.elastic_agent import ElasticLink, World
    from openclaw_launch.job.agents import AgentSetup
    from openclaw_launch.plan.model import LaunchPlan


@dataclass(frozen=True)
class ElasticJob:
    """An elastic job as the command line or the config asks for it."""

    spec: ElasticSpec
    addr: str  # the rendezvous: the first node's host
    port: int
    standby: bool
    node: str  # with --config: this launcher's node; else ""


def elastic_job(c: Common, want: Resolved, r: RunOptions, loaded: Config | None = None) -> ElasticJob | None:
    """``--nnodes MIN:MAX`` (torchrun's line), or a config's ``runtime.min_nodes``/``max_nodes``
    (the rendezvous on the first node's address, at the agents' port); None: a fixed-size job.
    ``--standby`` without an elastic job, or with a fixed node rank, is exit 2. ``loaded``: the
    ``--config`` already read (else it is read here)."""
    if r.standby and c.tr.node_rank is not None:
        raise click.BadParameter("a standby takes a lost node's rank: give no --node-rank", param_hint="--standby")
    config = (loaded or _config(c)) if c.config_path else None
    rt = config.runtime if config is not None else None
    if config is not None and rt is not None and rt.min_nodes is not None and rt.max_nodes is not None:
        node = node_name_for(config, c.node)
        master_port = want.master_port or rt.master_port or MASTER_PORT
        port = r.agent_port or (master_port + 1 if master_port < 65535 else master_port - 1)
        addr = config.nodes[0].ip or want.master_addr or rt.master_addr or "localhost"
        spec = ElasticSpec(rt.min_nodes, rt.max_nodes, want.last_call_timeout_s)
        return ElasticJob(spec, addr, port, r.standby or node in rt.standby_nodes, node)
    if r.standby and want.elastic is None:
        raise click.BadParameter(
            "needs an elastic job: --nnodes MIN:MAX (MIN < MAX) with --rdzv-backend c10d, or the config's "
            "runtime.min_nodes and max_nodes",
            param_hint="--standby",
        )
    if want.elastic is None:
        return None
    assert want.master_addr is not None and want.master_port is not None
    if r.agent_port is not None:
        raise click.BadParameter("elastic jobs meet at the --rdzv-endpoint port", param_hint="--agent-port")
    return ElasticJob(want.elastic, want.master_addr, want.master_port, r.standby, "")


def _config(c: Common) -> Config:
    from openclaw_launch.config.reader import load_config

    try:
        return load_config(c.config_path or "")
    except OpenclawError as e:
        fail(e)


def arrive_elastic(job: ElasticJob, want: Resolved, r: RunOptions, max_restarts: int) -> tuple[World, ElasticLink]:
    """Join the rendezvous and wait for the first world that holds this launcher (a standby: until
    it replaces a lost node). A signal in the wait exits 128+N, a refusal 2; a standby whose job
    ended without it exits 0."""
    from openclaw_launch.agents.elastic_agent import NotNeeded, elastic_arrive
    from openclaw_launch.agents.fate import AgentOptions
    from openclaw_launch.config.signals import signal_numbers
    from openclaw_launch.plan.context import free_port, release_port
    from openclaw_launch.run.osproc import RealOs

    if r.preflight_first:
        raise click.BadParameter("needs each node's --node-rank K (not an elastic job)", param_hint="--preflight")
    options = AgentOptions(
        store_addr=job.addr,
        port=job.port,
        nodes=(),
        join_timeout_s=r.agent_timeout_s,
        keepalive_s=r.keepalive_s,
        max_restarts=max_restarts,
    )
    os_layer = RealOs()
    os_layer.install_signals(signal_numbers(want.signals))
    port = free_port()
    try:
        signal_now = lambda: next(iter(os_layer.drain_signals()), None)  # noqa: E731
        answer = elastic_arrive(options, job.spec, job.standby, job.node, port, _echo_err, signal_now)
    except OpenclawError as e:
        fail(e)
    finally:
        os_layer.restore_signals()
    if isinstance(answer, int):
        click.echo(f"openclaw-launch: stopped by signal {answer} while the nodes met; started nothing", err=True)
        sys.exit(128 + answer)
    if isinstance(answer, NotNeeded):
        click.echo(f"openclaw-launch: {answer.text}; this launcher ran no ranks", err=True)
        sys.exit(0)
    world, link = answer
    if world.node_rank != 0:
        release_port(port)
    click.echo(
        f"openclaw-launch: world {world.round}: node rank {world.node_rank} of {world.nnodes} "
        f"(elastic {job.spec.text}, rendezvous at {job.addr}:{job.port})",
        err=True,
    )
    return world, link


def elastic_setup(
    c: Common, job: ElasticJob, r: RunOptions, plan: LaunchPlan, config: Any, world: World, link: ElasticLink
) -> AgentSetup:
    """The agent of an elastic job, with the plan of every later world (``replan``)."""
    from openclaw_launch.agents.elastic_agent import ElasticAgent
    from openclaw_launch.agents.fate import AgentOptions
    from openclaw_launch.agents.fingerprint import fingerprint
    from openclaw_launch.agents.versions import node_versions, python_version_of
    from openclaw_launch.job.agents import AgentSetup
    from openclaw_launch.plan.context import RunContext
    from openclaw_launch.topology.live import HOST_ROOT

    python = os.environ.get("PYTHON_EXEC") or sys.executable
    versions = node_versions(HOST_ROOT, lambda: python_version_of(python))  # once: the same every world

    by_config = bool(c.config_path)
    context = RunContext(plan.run_id, plan.run_dir, None if by_config else world.master_port, not by_config)
    own = dataclasses.replace(c, node=job.node or c.node)

    def replan(new: World) -> tuple[LaunchPlan, tuple[str, ...], dict[str, str]]:
        new_plan, new_config = plan_and_config(
            own,
            at_run=True,
            telemetry_mode=r.telemetry,
            hang_timeout_s=r.hang_timeout_s,
            arrival=None if by_config else (new.node_rank, new.master_port),
            world_nodes=new.nnodes,
            world_names=new.nodes if by_config else None,
            context=context,
        )
        nodes = tuple(n.name for n in new_config.nodes)
        return new_plan, nodes, fingerprint(new_config, new_plan, versions, os.environ)

    nodes = tuple(n.name for n in config.nodes)
    options = AgentOptions(
        store_addr=job.addr,
        port=job.port,
        nodes=nodes,
        join_timeout_s=r.agent_timeout_s,
        keepalive_s=r.keepalive_s,
        max_restarts=c.tr.max_restarts,
    )

    def make_agent(say: Any) -> ElasticAgent:
        return ElasticAgent(plan, options, say, link, world, replan)

    prints = fingerprint(config, plan, versions, os.environ)
    return dataclasses.replace(AgentSetup(options=options, fingerprint=prints), make_agent=make_agent)


def _echo_err(text: str) -> None:
    click.echo(text, err=True)
