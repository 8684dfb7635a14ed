"""The messages between the node agent (agents/fate.py) and its store helper (agents/store_loop.py),
as run/helper.py's typed link carries them (``VOCABULARY``):

- launcher -> helper: ``Arrive`` (node ranks by arrival: open the store, take a rank),
  ``Join`` (open the store unless open, claim the node rank, meet, compare fingerprints),
  ``StartLoop`` (the keep-alive loop), ``BeginAttempt``, ``PublishFate`` (compare-and-set this
  node's stop as ``fate/a``), ``SendEnd`` (``end/a/r``), ``Tick`` (the launcher's loop ran: the
  keep-alive counts these, agents/store_loop.py), ``FinishJob`` (stop the loop, exchange the
  reports, answer ``Reports``, exit).
- helper -> launcher: ``Opening`` (the store is being opened), ``Connected`` (it answered),
  ``Arrived`` (rank, MASTER_PORT), ``Joined``, or ``JoinFailed``; ``FateOf`` (the job's fate of an
  attempt, as the store holds it), ``Ended`` (every node is done with an attempt), ``LoopEnded``
  (the loop stopped: a lost node, or the first node's store unreachable), ``Say`` (a line for the
  console), ``Reports``.

Fates are the store's JSON text (agents/fate.py's ``Fate``); the loop reads only their ``kind``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from openclaw_launch.run.helper import Message, Vocabulary

# ---- launcher -> helper --------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrive(Message):
    nnodes: int
    token: str  # this launcher, as the holder of its node rank (meeting.launcher_token)
    master_port: int  # this host's free port: the job's if this launcher hosts the store
    rdzv_id: str = "none"  # --rdzv-id: a launcher of another job's id is refused before it takes a rank


@dataclass(frozen=True)
class Join(Message):
    me: int
    name: str
    nodes: tuple[str, ...]  # every node's name, by node rank
    token: str
    fingerprint: dict[str, str]


@dataclass(frozen=True)
class StartLoop(Message):
    pass


@dataclass(frozen=True)
class BeginAttempt(Message):
    attempt: int


@dataclass(frozen=True)
class PublishFate(Message):
    attempt: int
    fate: str  # agents/fate.py's Fate, as the store holds it


@dataclass(frozen=True)
class SendEnd(Message):
    attempt: int
    outcome: str


@dataclass(frozen=True)
class Tick(Message):
    """The launcher's loop ran: its supervision loop's timer (agents/fate.py), or a waiting step's."""


@dataclass(frozen=True)
class FinishJob(Message):
    payload: dict[str, Any]  # this node's report
    lost_nodes: tuple[str, ...]


# ---- helper -> launcher --------------------------------------------------------------------------


@dataclass(frozen=True)
class Opening(Message):
    pass


@dataclass(frozen=True)
class Connected(Message):
    pass


@dataclass(frozen=True)
class Arrived(Message):
    rank: int
    master_port: int


@dataclass(frozen=True)
class Joined(Message):
    pass


@dataclass(frozen=True)
class JoinFailed(Message):
    text: str


@dataclass(frozen=True)
class FateOf(Message):
    attempt: int
    fate: str


@dataclass(frozen=True)
class Ended(Message):
    attempt: int
    outcomes: tuple[str, ...] = ()  # the nodes' distinct end outcomes; none when the first node is lost


@dataclass(frozen=True)
class LoopEnded(Message):
    pass


@dataclass(frozen=True)
class Say(Message):
    text: str


@dataclass(frozen=True)
class Reports(Message):
    reports: tuple[dict[str, Any], ...] | None  # on the first node: every node's; else None


VOCABULARY = Vocabulary(
    to_helper=(Arrive, Join, StartLoop, BeginAttempt, PublishFate, SendEnd, Tick, FinishJob),
    to_launcher=(Opening, Connected, Arrived, Joined, JoinFailed, FateOf, Ended, LoopEnded, Say, Reports),
)
