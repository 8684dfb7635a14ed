"""``run`` with ``--nnodes MIN:MAX`` (or ``--standby``): the first world from the rendezvous before the
plan is built, and the agent that re-forms it (agents/elastic_agent.py) with a ``replan`` that builds
the same pure plan for node rank k of n, on the first plan's run context."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from openclaw_launch.cli.common import Common, fail, plan_and_config
from openclaw_launch.cli.run_options import RunOptions
from openclaw_launch.cli.torchrun_resolve import Resolved
from openclaw_launch.errors import OpenclawError

if TYPE_CHECKING:
    from openclaw_launch.agents.elastic_agent import ElasticLink, World
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.run.launch import AgentSetup


def check_standby(want: Resolved, r: RunOptions, node_rank_given: bool) -> None:
    """``--standby`` belongs to an elastic job whose node ranks the rendezvous gives (exit 2)."""
    if not r.standby:
        return
    if node_rank_given:
        raise click.BadParameter("a standby takes a lost node's rank: give no --node-rank", param_hint="--standby")
    if want.elastic is None:
        raise click.BadParameter(
            "needs an elastic job: --nnodes MIN:MAX (MIN < MAX) with --rdzv-backend c10d", param_hint="--standby"
        )


def arrive_elastic(want: Resolved, r: RunOptions, max_restarts: int) -> tuple[World, ElasticLink]:
    """Join the rendezvous at the endpoint and wait for the first world that holds this launcher (a
    standby: until it replaces a lost node). A signal in the wait exits 128+N, a refusal 2; a
    standby whose job ended without it exits 0."""
    from openclaw_launch.agents.elastic_agent import NotNeeded, elastic_arrive
    from openclaw_launch.agents.fate import AgentOptions
    from openclaw_launch.cli.torchrun_resolve import free_port, release_port
    from openclaw_launch.config.signals import signal_numbers
    from openclaw_launch.run.osproc import RealOs

    assert want.elastic is not None and want.master_addr is not None and want.master_port is not None
    if r.agent_port is not None:
        raise click.BadParameter("elastic jobs meet at the --rdzv-endpoint port", param_hint="--agent-port")
    if r.preflight_first:
        raise click.BadParameter("needs each node's --node-rank K (not an elastic job)", param_hint="--preflight")
    options = AgentOptions(
        store_addr=want.master_addr,
        port=want.master_port,
        nodes=(),
        join_timeout_s=r.agent_timeout_s,
        keepalive_s=r.keepalive_s,
        max_restarts=max_restarts,
    )
    os_layer = RealOs()
    os_layer.install_signals(signal_numbers(want.signals))
    port = free_port()
    try:
        answer = elastic_arrive(
            options, want.elastic, r.standby, port, _echo_err, lambda: next(iter(os_layer.drain_signals()), None)
        )
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
    where = f"{want.master_addr}:{want.master_port}"
    click.echo(
        f"openclaw-launch: world {world.round}: node rank {world.node_rank} of {world.nnodes} "
        f"(--nnodes {want.elastic.text}, rendezvous at {where})",
        err=True,
    )
    return world, link


def elastic_setup(
    c: Common, want: Resolved, r: RunOptions, plan: LaunchPlan, config: Any, world: World, link: ElasticLink
) -> AgentSetup:
    """The agent of an elastic job, with the plan of every later world (``replan``)."""
    from openclaw_launch.agents.elastic_agent import ElasticAgent
    from openclaw_launch.agents.fate import AgentOptions
    from openclaw_launch.agents.fingerprint import fingerprint
    from openclaw_launch.agents.versions import node_versions, python_version_of
    from openclaw_launch.plan.context import RunContext
    from openclaw_launch.run.launch import AgentSetup
    from openclaw_launch.topology.live import HOST_ROOT

    python = os.environ.get("PYTHON_EXEC") or sys.executable
    versions = node_versions(HOST_ROOT, lambda: python_version_of(python))  # once: the same every world

    def replan(node_rank: int, nnodes: int) -> tuple[LaunchPlan, tuple[str, ...], dict[str, str]]:
        new_plan, new_config = plan_and_config(
            c,
            at_run=True,
            telemetry_mode=r.telemetry,
            hang_timeout_s=r.hang_timeout_s,
            arrival=(node_rank, world.master_port),
            world_nodes=nnodes,
            context=RunContext(plan.run_id, plan.run_dir, world.master_port, by_arrival=True),
        )
        nodes = tuple(n.name for n in new_config.nodes)
        return new_plan, nodes, fingerprint(new_config, new_plan, versions, os.environ)

    nodes = tuple(n.name for n in config.nodes)
    options = AgentOptions(
        store_addr=want.master_addr or "",
        port=want.master_port or 0,
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
