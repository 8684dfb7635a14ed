"""An elastic job's node report (agents/elastic_agent.py's ``ElasticAgent``): each attempt's world
(``attempt_history[].membership``, with the nodes taken out at its re-forming) and every node
taken out (``exclusions[]``)."""

from __future__ import annotations

import dataclasses

from openclaw_launch.agents.elastic_agent import ElasticAgent
from openclaw_launch.agents.fate import Agent
from openclaw_launch.report.membership import AttemptMembership
from openclaw_launch.report.model import NodeReport


def with_memberships(report: NodeReport, agent: Agent | None) -> NodeReport:
    """Each attempt's world in the node's report (``attempt_history[].membership``)."""
    if not isinstance(agent, ElasticAgent):
        return report
    history = []
    for entry in report.attempt_history:
        world = agent.memberships.get(agent.first_round + entry.attempt)
        if world is not None:
            size = agent.world_sizes.get(world.round, 0)
            membership = AttemptMembership(
                world.round,
                tuple(t.split(" #")[0] for t in world.tokens),
                world.node_rank,
                size,
                agent.exclusion_log.excluded_before(world.round),
            )
            entry = dataclasses.replace(entry, membership=membership)
        history.append(entry)
    return dataclasses.replace(report, attempt_history=tuple(history), exclusions=tuple(agent.exclusions))
