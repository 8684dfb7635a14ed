"""The report's record of an elastic job's world in one attempt (agents/elastic_agent.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc


@dataclass(frozen=True)
class AttemptMembership:
    world: int = field(metadata=doc("the world's number: the job's attempt (`TORCHELASTIC_RESTART_COUNT`)"))
    nodes: tuple[str, ...] = field(metadata=doc("each node's launcher (`host pid N`), by node rank"))
    node_rank: int = field(metadata=doc("this node's rank in that world (`GROUP_RANK`)"))
    world_size: int = field(metadata=doc("ranks in that world (`WORLD_SIZE`)"))
