"""An elastic job's node health (docs/elastic.md, "Nodes taken out for good"): this node's own fault
after a failed attempt, which takes it out of the job at the re-forming (agents/exclusions.py): its
failure of a node class (run/failure_class.NODE_CLASSES, from the failure policy) or GPU memory its
GPUs did not free (run/gpu_memory.py's gate, a supervision participant). Wired here, between the
participants, as the failure policy's steps come from the statistics."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from openclaw_launch.agents.exclusions import Fault
from openclaw_launch.report.membership import GPU_MEMORY_HELD
from openclaw_launch.run.failure_class import NODE_CLASSES
from openclaw_launch.run.gpu_memory import GpuMemoryGate, memory_reader
from openclaw_launch.run.participant import Participant

if TYPE_CHECKING:
    from openclaw_launch.agents.fate import Agent
    from openclaw_launch.job.agents import AgentSetup
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.run.failure_policy import FailurePolicy
    from openclaw_launch.stats.session import StatsSession


def equip(agent: Agent, agents: AgentSetup) -> None:
    """An elastic agent's ``--exclude-file`` and ``--gpu-memory-timeout-s``."""
    from openclaw_launch.agents.elastic_agent import ElasticAgent

    if isinstance(agent, ElasticAgent):
        agent.exclusion_log.path = agents.exclude_file
        agent.gpu_memory_timeout_s = agents.gpu_memory_timeout_s


def node_health(
    agent: Agent | None,
    plan: LaunchPlan,
    policy: FailurePolicy,
    session: StatsSession | None,
    say: Callable[[str], None],
) -> list[Participant]:
    """An elastic agent's own fault per attempt, and the GPU memory gate it takes (for the
    supervision's participants); nothing for another job."""
    from openclaw_launch.agents.elastic_agent import ElasticAgent

    if not isinstance(agent, ElasticAgent):
        return []
    uuids = [r.gpu_uuid for r in plan.ranks if r.gpu_uuid]
    reader = functools.partial(memory_reader, dict(os.environ))
    gate = GpuMemoryGate(uuids, reader, agent.gpu_memory_timeout_s, policy.max_restarts, say)
    agent.node_fault = functools.partial(own_fault, policy, gate)
    if session is not None:
        agent.exclusion_log.count = session.count_exclusion
    return [gate]


def own_fault(policy: FailurePolicy, gate: GpuMemoryGate, attempt: int) -> Fault | None:
    """This node's own fault in ``attempt``: its rank's failure of a node class (a rank: its own worker,
    not a lost node), else GPU memory its GPUs held."""
    failure = policy.failures.get(attempt)
    if failure is not None and failure.name in NODE_CLASSES and failure.rank is not None:
        return Fault(failure.name, failure.detail)
    held = gate.held.get(attempt)
    return Fault(GPU_MEMORY_HELD, held) if held is not None else None
