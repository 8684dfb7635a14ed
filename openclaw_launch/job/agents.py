"""A multi-node job's agents, set up once for the three ways its nodes meet: a fixed-size job (every
node's rank given), node ranks by arrival, and an elastic job whose worlds re-form. Here are the
rules they share: the agents' port, their options, this node's versions and fingerprint, and every
later world's plan with them; the command line only parses the options and prints the messages. The
meeting before the plan (by arrival, an elastic job's first world) is job/meeting.py."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openclaw_launch.config import defaults
from openclaw_launch.errors import PlanError

if TYPE_CHECKING:
    from openclaw_launch.agents.elastic_link import ElasticLink, World
    from openclaw_launch.agents.fate import Agent, AgentOptions, Arrival
    from openclaw_launch.agents.membership import ElasticSpec
    from openclaw_launch.agents.store_link import StoreLink
    from openclaw_launch.agents.straggler_policy import StragglerSettings
    from openclaw_launch.config.model import Config
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.stats.job_live import JobLiveTarget

#: An elastic job's plan of a world (node rank k of n, and with a config the world's node names):
#: the plan and the config narrowed to that world's nodes.
PlanWorld = Callable[["World"], tuple["LaunchPlan", "Config"]]


@dataclass(frozen=True)
class AgentSetup:
    """A multi-node job's agent: where the agents meet, and what this node must agree on."""

    options: AgentOptions
    fingerprint: dict[str, str]
    job_report_path: str | None = None  # the first node writes the job's report here
    link: StoreLink | None = None  # node ranks by arrival: the helper that took this node's rank
    make_agent: Callable[[Callable[[str], None]], Agent] | None = None  # elastic: agents/elastic_agent.py's
    exclude_file: str | None = None  # elastic: --exclude-file (cli/exclude.py)
    gpu_memory_timeout_s: float = defaults.GPU_MEMORY_TIMEOUT_S  # elastic: --gpu-memory-timeout-s


@dataclass(frozen=True)
class AgentWaits:
    """How long the agents wait: for every node to meet (``--agent-timeout-s``), and for a silent
    node before it is lost (``--keepalive-s``)."""

    join_timeout_s: float = defaults.AGENT_TIMEOUT_S
    keepalive_s: float = defaults.KEEPALIVE_S


@dataclass(frozen=True)
class ElasticJob:
    """An elastic job as the command line or the config asks for it."""

    spec: ElasticSpec
    addr: str  # the rendezvous: the first node's host
    port: int
    standby: bool
    node: str  # with --config: this launcher's node; else ""
    rdzv_id: str = "none"  # --rdzv-id (torchrun's default: none): the rendezvous's keys are under it


def agent_port(master_port: int, given: int | None = None) -> int:
    """Where the agents of a job with fixed node ranks or a config meet: ``--agent-port``, else the
    port after MASTER_PORT (the one before it at 65535). Never MASTER_PORT itself: rank 0's store
    listens there."""
    port = given if given is not None else master_port + 1 if master_port < 65535 else master_port - 1
    if port == master_port:
        raise PlanError(
            f"--agent-port {port} is MASTER_PORT; the agents need a port of their own: give another "
            "--agent-port, or none (MASTER_PORT+1)"
        )
    return port


def agent_options(
    addr: str, port: int, waits: AgentWaits, nodes: tuple[str, ...] = (), max_restarts: int = 0
) -> AgentOptions:
    """The agents' options. ``nodes`` (node rank -> name) and ``max_restarts`` are the plan's; a
    meeting before the plan has neither yet."""
    from openclaw_launch.agents.fate import AgentOptions

    return AgentOptions(
        store_addr=addr,
        port=port,
        nodes=nodes,
        join_timeout_s=waits.join_timeout_s,
        keepalive_s=waits.keepalive_s,
        max_restarts=max_restarts,
    )


def fixed_agents(
    plan: LaunchPlan, config: Config, waits: AgentWaits, max_restarts: int, given_port: int | None
) -> AgentSetup:
    """The agents of a job whose node ranks are given: they meet on the first node's address at
    ``agent_port``. Imports torch's store: several nodes only."""
    master_port = plan.master_port
    assert master_port is not None  # only a one-node plan that starts nothing leaves it to the run
    addr = config.nodes[0].ip or plan.master_addr
    options = agent_options(addr, agent_port(master_port, given_port), waits, _names(config), max_restarts)
    return AgentSetup(options=options, fingerprint=_fingerprint(config, plan, _versions()))


def arrival_agents(plan: LaunchPlan, config: Config, arrival: Arrival, max_restarts: int) -> AgentSetup:
    """The agents of a job whose node ranks came by arrival: the rendezvous's helper, which took
    this node's rank, is the agent's from now on."""
    options = dataclasses.replace(arrival.options, nodes=_names(config), max_restarts=max_restarts)
    return AgentSetup(options=options, fingerprint=_fingerprint(config, plan, _versions()), link=arrival.link)


def elastic_agents(
    plan: LaunchPlan,
    config: Config,
    job: ElasticJob,
    waits: AgentWaits,
    max_restarts: int,
    first: tuple[World, ElasticLink],
    plan_world: PlanWorld,
    straggler: StragglerSettings | None = None,
) -> AgentSetup:
    """The agent of an elastic job in its ``first`` world, which re-forms with ``plan_world``'s plan
    of every later one (the versions are read once: they are the same in every world); ``straggler``:
    the straggler policy it carries out (``--on-straggler``, agents/straggler_actions.py)."""
    from openclaw_launch.agents.elastic_agent import ElasticAgent

    versions = _versions()
    world, link = first

    def replan(new: World) -> tuple[LaunchPlan, tuple[str, ...], dict[str, str]]:
        new_plan, new_config = plan_world(new)
        return new_plan, _names(new_config), _fingerprint(new_config, new_plan, versions)

    options = agent_options(job.addr, job.port, waits, _names(config), max_restarts)

    def make_agent(say: Callable[[str], None]) -> Agent:
        return ElasticAgent(plan, options, say, link, world, replan, straggler)

    return AgentSetup(options=options, fingerprint=_fingerprint(config, plan, versions), make_agent=make_agent)


def job_live_target(setup: AgentSetup, run_id: str, threshold_pct: float) -> JobLiveTarget:
    """Where every node's statistics helper sends its intervals for the job's live verdict
    (stats/job_live.py): the agents' store, with the standard-library client (no torch import)."""
    from datetime import timedelta

    from openclaw_launch.agents.tcpstore_client import TCPStoreClient
    from openclaw_launch.stats.job_live import JobLiveTarget

    def connect(host: str, port: int, timeout_s: float) -> TCPStoreClient:
        return TCPStoreClient(host, port, timedelta(seconds=timeout_s))

    return JobLiveTarget(setup.options.store_addr, setup.options.port, run_id, threshold_pct, connect)


def _names(config: Config) -> tuple[str, ...]:
    return tuple(n.name for n in config.nodes)


def _versions() -> dict[str, str]:
    """This node's torch, NCCL, CUDA, driver and the workers' Python (``PYTHON_EXEC``, as the plan's)."""
    from openclaw_launch.agents.versions import node_versions, python_version_of
    from openclaw_launch.plan.env import worker_python
    from openclaw_launch.topology.live import HOST_ROOT

    python = worker_python(os.environ)
    return node_versions(HOST_ROOT, lambda: python_version_of(python))


def _fingerprint(config: Config, plan: LaunchPlan, versions: dict[str, str]) -> dict[str, str]:
    from openclaw_launch.agents.fingerprint import fingerprint

    return fingerprint(config, plan, versions, os.environ)
