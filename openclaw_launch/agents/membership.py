"""Elastic membership, pure: who is in each world of a ``--nnodes MIN:MAX`` job, in node-rank order.

A member is one launcher that joined the rendezvous (agents/elastic.py), numbered in order of
arrival (the rendezvous host, the first node, is member 0). The first world is formed once MIN
active members are there, after the last-call wait for more (up to MAX). Every later world is formed
from the one before: the survivors keep their order; a lost node's rank goes to a standby where
there is one (the world keeps its size), else the ranks close up (0..n-1); members that arrived
while the job ran are taken in after them, up to MAX. A world below MIN ends the job.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Sequence
from dataclasses import dataclass

ID_KEY = "el/id"  # the store's key (unscoped) of the rendezvous id of the elastic job it holds


def namespace(rdzv_id: str) -> str:
    """Where the store keys of rendezvous ``rdzv_id`` go: another job's launcher (another
    ``--rdzv-id``) at the same endpoint reads and writes none of them."""
    return f"el/{urllib.parse.quote(rdzv_id, safe='')}/"


@dataclass(frozen=True)
class ElasticSpec:
    """``--nnodes MIN:MAX`` and torchrun's ``last_call_timeout`` (``--rdzv-conf``)."""

    min_nodes: int
    max_nodes: int
    last_call_timeout_s: float

    @property
    def text(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}"


@dataclass(frozen=True)
class Member:
    member_id: int  # order of arrival at the rendezvous
    token: str  # the launcher (host, pid, a random part): agents/meeting.py's launcher_token
    standby: bool  # runs no ranks until it replaces a lost node
    node: str = ""  # with --config: its node's name (the world's plan lists these nodes in node-rank order)


def first_world(members: Sequence[Member], spec: ElasticSpec) -> tuple[int, ...]:
    """The first world: the active members in order of arrival, at most MAX (standbys wait)."""
    return tuple(m.member_id for m in members if not m.standby)[: spec.max_nodes]


def next_world(
    previous: Sequence[int], gone: Collection[int], waiting: Sequence[Member], spec: ElasticSpec
) -> tuple[int, ...]:
    """The world after ``previous`` (member ids by node rank), without the ``gone`` members:
    standbys among ``waiting`` (members alive and in no world, in order of arrival) take the lost
    nodes' ranks, then the other waiting members join, up to MAX. The caller checks MIN."""
    standbys = [m.member_id for m in waiting if m.standby]
    slots: list[int | None] = []
    for member_id in previous:
        if member_id not in gone:
            slots.append(member_id)
        elif standbys:
            slots.append(standbys.pop(0))
    world = [s for s in slots if s is not None]
    for m in waiting:
        if not m.standby and len(world) < spec.max_nodes:
            world.append(m.member_id)
    return tuple(world)


def wants_growth(world: Sequence[int], waiting: Sequence[Member], spec: ElasticSpec) -> bool:
    """A member waiting to run ranks (not a standby) and room for it: re-form to take it in."""
    return len(world) < spec.max_nodes and any(not m.standby for m in waiting)


def exclusion_refusal(
    world: Sequence[int],
    node_rank: int,
    gone: Collection[int],
    waiting: Sequence[Member],
    spec: ElasticSpec,
    restarts_left: int,
) -> str | None:
    """Why node rank ``node_rank`` of the running ``world`` may not be taken out (the straggler
    policy, agents/straggler_policy.py), or None: the world after it (a standby in its place, else
    one node fewer) keeps MIN nodes, a restart is left for the re-forming, and it is not the first
    node (it hosts the rendezvous)."""
    if not 0 < node_rank < len(world):
        return f"node rank {node_rank} is not a node the first node can take out of a world of {len(world)}"
    if restarts_left < 1:
        return "no restart is left for the re-forming (--max-restarts)"
    after = next_world(world, {*gone, world[node_rank]}, waiting, spec)
    if len(after) < spec.min_nodes:
        return (
            f"{len(after)} node(s) would be left and no standby takes its place: fewer than MIN (--nnodes {spec.text})"
        )
    return None
