"""The launcher's own lighthouse's quorum rule: torchft 0.2.0's (``src/lighthouse.rs``,
``quorum_compute`` and ``_quorum_tick``), plus the one thing torchft's cannot do: drop a replica group
the launcher saw die (``group_gone``).

torchft's rule, kept as it is so that its Managers see the quorums they expect:

- a replica is healthy while its last heartbeat (a quorum request is one too) is younger than the
  heartbeat timeout; a participant is a healthy replica that asked for a quorum since the last one;
- fast quorum: when every member of the previous quorum is a participant again, the participants
  are the quorum at once (with ``shrink_only`` only the previous members among them);
- otherwise at least ``min_replicas`` participants, more than half of the healthy replicas (no split
  brain), and the healthy replicas that have not asked yet are waited for until the join timeout
  after the first participant joined;
- members are sorted by replica id; the quorum id goes up by one only when the members (their ids,
  in order) differ from the previous quorum's, or a member reports commit failures; the participants
  are cleared with every quorum.

What torchft cannot know, the launcher can: a group's rank died (its group launcher's SIGCHLD). The
notice names the group's store port (its ``MASTER_PORT``, unique per group on the node), and each
replica is mapped to a port by the ``store_address`` of its quorum requests, which torchft's Manager
sets to ``MASTER_ADDR:MASTER_PORT``. ``group_gone`` removes those replicas' heartbeats and
participation, and ignores them from then on (a Manager's replica id carries a fresh UUID per start,
so the group's restarted Manager is a new replica), so the next quorum forms without waiting for a
heartbeat to expire. A replica that has only heartbeated (no quorum request yet) has no port and is
left to the heartbeat timeout, as under torchft.

One more thing torchft cannot know: how many groups there are (``expected_replicas``, the launcher's
K). At the job's start a group still importing torch would miss the short join timeout, a quorum
would form without it and another when it joins, each a reconfiguration for every group.
So the first quorum waits until every expected group has a participant or was said gone (a notice
for its port, even before its Manager asked: it is not waited for), for at most ``start_timeout_s``
after the first quorum request; then, and after the first quorum, torchft's rule alone (a restarted
group must not hold the survivors). ``expected_replicas`` 0: torchft's rule from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Member(Protocol):
    """What the rule reads of torchft's ``QuorumMember`` (run/lighthouse_proto.py)."""

    replica_id: str
    store_address: str
    shrink_only: bool
    commit_failures: int


@dataclass(frozen=True)
class QuorumSettings:
    """torchft_lighthouse's options, in seconds (config/defaults.py's ``LIGHTHOUSE_*`` for the launcher)."""

    min_replicas: int
    join_timeout_s: float
    heartbeat_timeout_s: float
    expected_replicas: int = 0  # the groups the first quorum waits for (0: none, torchft's rule)
    start_timeout_s: float = 0.0  # at most this long after the first quorum request


@dataclass(frozen=True)
class Formed:
    """A quorum: its id and members, sorted by replica id."""

    quorum_id: int
    members: tuple[Member, ...]


def store_port(store_address: str) -> str:
    """The port of a Manager's ``store_address`` (``host:port``, the host possibly IPv6)."""
    return store_address.rsplit(":", 1)[-1]


@dataclass
class QuorumState:
    settings: QuorumSettings
    heartbeats: dict[str, float] = field(default_factory=dict)  # replica id -> last heartbeat (monotonic s)
    participants: dict[str, tuple[float, Member]] = field(default_factory=dict)  # replica id -> (joined, member)
    previous: Formed | None = None
    quorum_id: int = 0
    ports: dict[str, str] = field(default_factory=dict)  # replica id -> its group's store port
    gone: set[str] = field(default_factory=set)  # replicas of groups the launcher said gone
    gone_ports: set[str] = field(default_factory=set)  # the store ports of those groups

    def heartbeat(self, replica_id: str, now: float) -> bool:
        """A heartbeat; False (ignored): the replica's group was said gone."""
        if replica_id in self.gone:
            return False
        self.heartbeats[replica_id] = now
        return True

    def join(self, member: Member, now: float) -> bool:
        """A quorum request (an implicit heartbeat); False (refused): the replica's group is gone."""
        if not self.heartbeat(member.replica_id, now):
            return False
        self.participants[member.replica_id] = (now, member)
        self.ports[member.replica_id] = store_port(member.store_address)
        return True

    def group_gone(self, port: str) -> list[str]:
        """The launcher saw the group whose store port is ``port`` die: its replicas leave at once."""
        self.gone_ports.add(port)
        removed = sorted(r for r, p in self.ports.items() if p == port and r not in self.gone)
        for replica_id in removed:
            self.gone.add(replica_id)
            self.heartbeats.pop(replica_id, None)
            self.participants.pop(replica_id, None)
        return removed

    def compute(self, now: float) -> tuple[list[Member] | None, str]:
        """torchft's ``quorum_compute``: the members of a quorum that can form now (None: none yet), and why."""
        timeout_s = self.settings.heartbeat_timeout_s
        healthy = {r for r, seen in self.heartbeats.items() if now - seen < timeout_s}
        joined = {r: d for r, d in self.participants.items() if r in healthy}
        candidates = sorted((member for _, member in joined.values()), key=lambda m: m.replica_id)
        shrink_only = any(member.shrink_only for _, member in joined.values())
        metadata = (
            f"[{len(joined)}/{len(self.participants)} participants healthy][{len(healthy)} heartbeating]"
            f"[shrink_only={str(shrink_only).lower()}]"
        )
        if self.previous is not None:
            previous_ids = {m.replica_id for m in self.previous.members}
            if shrink_only:
                candidates = [m for m in candidates if m.replica_id in previous_ids]
            if previous_ids <= joined.keys():
                return candidates, f"Fast quorum found! {metadata}"
        first_joined = min((joined_at for joined_at, _ in joined.values()), default=now)
        starting = self.starting(joined.keys())
        if starting and now - first_joined < self.settings.start_timeout_s:
            return None, (
                f"First quorum not ready, waiting for {starting} of {self.settings.expected_replicas} replica groups "
                f"still starting (start timeout {self.settings.start_timeout_s:g} s) {metadata}"
            )
        if len(joined) < self.settings.min_replicas:
            return None, (
                f"New quorum not ready, only have {len(joined)} participants, need min_replicas "
                f"{self.settings.min_replicas} {metadata}"
            )
        if len(joined) <= len(healthy) // 2:
            return None, (
                f"New quorum not ready, only have {len(joined)} participants, need at least half of {len(healthy)} "
                f"healthy workers {metadata}"
            )
        if len(joined) != len(healthy) and now - first_joined < self.settings.join_timeout_s:
            return None, (
                f"Valid quorum with {len(joined)} participants, waiting for {len(healthy) - len(joined)} healthy but "
                f"not participating stragglers due to join timeout {metadata}"
            )
        return candidates, f"Valid quorum found {metadata}"

    def starting(self, joined: Iterable[str]) -> int:
        """Before the first quorum: the expected groups with no participant among ``joined`` that were
        not said gone (a restarted group's new replica has a gone port: that group counts as gone)."""
        if self.previous is not None:
            return 0
        ports = {self.ports[r] for r in joined} - self.gone_ports
        return max(self.settings.expected_replicas - len(self.gone_ports) - len(ports), 0)

    def tick(self, now: float) -> tuple[Formed | None, str]:
        """torchft's ``_quorum_tick``: the quorum that forms now, if one does (the participants
        cleared), and the reason (``compute``'s, with the quorum id's change)."""
        members, reason = self.compute(now)
        if members is None:
            return None, reason
        if self.previous is None or _ids(members) != _ids(self.previous.members):
            self.quorum_id += 1
            reason += "; members changed"
        elif any(m.commit_failures > 0 for m in members):
            self.quorum_id += 1
            reason += "; commit failures"
        self.previous = Formed(self.quorum_id, tuple(members))
        self.participants.clear()
        return self.previous, reason


def _ids(members: Sequence[Member]) -> list[str]:
    return [m.replica_id for m in members]
