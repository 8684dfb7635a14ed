"""``run`` with ``--nnodes MIN:MAX`` (or ``--standby``): the elastic job the options ask for, the wait
for its first world before the plan is built (job/meeting.py) with its messages, and the plan of
every later world: the same pure plan for node rank k of n, from the command's inputs (the config
and host read once) on the first plan's run context."""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

import click

from openclaw_launch.cli.common import (
    Common,
    Inputs,
    echo_err,
    fail,
    node_name_for,
    plan_and_config,
    stopped_meeting,
)
from openclaw_launch.cli.run_options import RunOptions
from openclaw_launch.config.defaults import MASTER_PORT
from openclaw_launch.errors import OpenclawError
from openclaw_launch.job.agents import ElasticJob, PlanWorld, agent_port

if TYPE_CHECKING:
    from openclaw_launch.agents.elastic_link import ElasticLink, World
    from openclaw_launch.config.model import Config
    from openclaw_launch.plan.model import LaunchPlan


def elastic_job(c: Common, inputs: Inputs, r: RunOptions) -> ElasticJob | None:
    """``--nnodes MIN:MAX`` (torchrun's line), or a config's ``runtime.min_nodes``/``max_nodes``
    (the rendezvous on the first node's address, at the agents' port); None: a fixed-size job.
    ``--standby`` without an elastic job, or with a fixed node rank, is exit 2."""
    want, config = inputs.want, inputs.config
    if r.standby and c.tr.node_rank is not None:
        raise click.BadParameter("a standby takes a lost node's rank: give no --node-rank", param_hint="--standby")
    rt = config.runtime if config is not None else None
    if config is not None and rt is not None and rt.min_nodes is not None and rt.max_nodes is not None:
        from openclaw_launch.agents.membership import ElasticSpec

        node = node_name_for(config, c.node)
        port = agent_port(want.master_port or rt.master_port or MASTER_PORT, r.agent_port)
        addr = config.nodes[0].ip or want.master_addr or rt.master_addr or "localhost"
        spec = ElasticSpec(rt.min_nodes, rt.max_nodes, want.last_call_timeout_s)
        return ElasticJob(spec, addr, port, r.standby or node in rt.standby_nodes, node, c.tr.run_id or "none")
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
    return ElasticJob(want.elastic, want.master_addr, want.master_port, r.standby, "", c.tr.run_id or "none")


def arrive_elastic(job: ElasticJob, inputs: Inputs, r: RunOptions, max_restarts: int) -> tuple[World, ElasticLink]:
    """Wait for the first world that holds this launcher (a standby: until it replaces a lost node).
    A signal in the wait exits 128+N, a refusal 2; a standby whose job ended without it exits 0."""
    from openclaw_launch.agents.elastic_link import NotNeeded
    from openclaw_launch.config.signals import signal_numbers
    from openclaw_launch.job.meeting import meet_first_world

    if r.preflight_first:
        raise click.BadParameter("needs each node's --node-rank K (not an elastic job)", param_hint="--preflight")
    signals = signal_numbers(inputs.want.signals)
    try:
        answer = meet_first_world(job, r.agent_waits(), max_restarts, signals, echo_err)
    except OpenclawError as e:
        fail(e)
    if isinstance(answer, int):
        stopped_meeting(answer)
    if isinstance(answer, NotNeeded):
        click.echo(f"openclaw-launch: {answer.text}; this launcher ran no ranks", err=True)
        sys.exit(0)
    world, _ = answer
    click.echo(
        f"openclaw-launch: world {world.round}: node rank {world.node_rank} of {world.nnodes} "
        f"(elastic {job.spec.text}, rendezvous at {job.addr}:{job.port})",
        err=True,
    )
    return answer


def world_planner(
    c: Common, inputs: Inputs, r: RunOptions, job: ElasticJob, plan: LaunchPlan, first: World
) -> PlanWorld:
    """The plan of every later world, as ``run`` planned the ``first``: from the same inputs (the
    config the job started with, narrowed to the world's nodes; the host read once) and on the first
    plan's run context (its id, directory and, without a config, node rank 0's MASTER_PORT)."""
    from openclaw_launch.plan.context import RunContext

    by_config = inputs.config is not None
    context = RunContext(plan.run_id, plan.run_dir, None if by_config else first.master_port, not by_config)
    own = dataclasses.replace(c, node=job.node or c.node)

    def plan_world(world: World) -> tuple[LaunchPlan, Config]:
        return plan_and_config(
            own,
            inputs,
            at_run=True,
            run=r,
            arrival=None if by_config else (world.node_rank, world.master_port),
            elastic=job.spec,
            world_nodes=world.nnodes,
            world_names=world.nodes if by_config else None,
            context=context,
        )

    return plan_world
