"""What the launch needs of a multi-node job's agents: where they meet and what this node must agree on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openclaw_launch.agents.fate import Agent, AgentOptions
    from openclaw_launch.agents.store_loop import StoreLink


@dataclass(frozen=True)
class AgentSetup:
    """A multi-node job's agent: where the agents meet, and what this node must agree on."""

    options: AgentOptions
    fingerprint: dict[str, str]
    job_report_path: str | None = None  # the first node writes the job's report here
    link: StoreLink | None = None  # node ranks by arrival: the helper that took this node's rank
    make_agent: Callable[[Callable[[str], None]], Agent] | None = None  # elastic: agents/elastic_agent.py's
