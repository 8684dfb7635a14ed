"""The first node's forming of every world after the first (agents/elastic.py's ``Rendezvous``
holds the state; this is its re-forming, apart from the arrival and the liveness port): the
survivors, the standbys and the members that arrived, less the nodes taken out for good
(agents/exclusions.py), published as the next world with the exclusions made at its re-forming.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from openclaw_launch.agents.exclusions import Exclusions, Fault, Leave, members_faults, say_ready
from openclaw_launch.agents.liveness import LivenessServer
from openclaw_launch.agents.membership import ElasticSpec, Member, next_world
from openclaw_launch.agents.store import AgentStore
from openclaw_launch.codec import to_json
from openclaw_launch.report.membership import Exclusion

_POLL_S = 0.05
NEWS = "news"  # the counter of the first node's changes a waiting member looks for (``news/<k>``: the k-th)


class WorldForming:
    """The re-forming half of the rendezvous (the first node's; ``ready`` is every member's)."""

    store: AgentStore
    spec: ElasticSpec
    say: Callable[[str], None]
    timeout_s: float
    keepalive_s: float
    member_id: int
    round: int
    _lock: threading.Lock
    _members: dict[int, Member]
    _dead: set[int]
    _world: tuple[int, ...]
    _running: bool
    _port: LivenessServer | None
    _pinged_at: float | None
    _news: int  # the first node's changes a waiting member looks for, so far (agents/elastic.py's ``news``)
    exclusions: Exclusions
    _out: set[int]  # the members of the nodes taken out

    def _idle(self) -> list[Member]:
        """(Under the lock.) The members alive, not taken out and in no world (standbys, arrivals), by arrival."""
        gone = self._dead | self._out
        return [self._members[i] for i in sorted(self._members) if i not in self._world and i not in gone]

    def ready(self, fault: Fault | None) -> None:
        """A member at the end of world ``round``: ask for the next, saying whether it leaves (``fault``)."""
        say_ready(self.store, self.round, self.member_id, fault)

    def reform(
        self, lost_ranks: set[int], fault: Fault | None = None, lost_text: str = "", leave: tuple[Leave, ...] = ()
    ) -> None:
        """The first node, after world ``round`` ended: publish the next from its survivors (less
        ``lost_ranks``, the fate's lost node, and the nodes taken out: agents/exclusions.py), the
        standbys and the members that arrived. A waiting member the next world would take in is asked
        whether its launcher runs (agents/liveness.py's PING) and must answer within ``--keepalive-s``;
        one that does not is skipped, and the world forms with who is there. ``fault``: this node's
        own (it hosts the rendezvous: no next world without it); ``leave``: the nodes its launcher takes out."""
        with self._lock:
            asked, self._pinged_at = self._pinged_at, None
            if asked is None:  # no loss or arrival asked them at the fate: ask now
                asked = self._ping_waiting()
            self._running = False
            lost = {self._world[r] for r in lost_ranks if r < len(self._world)}
            self._dead |= lost  # for good: a cut link
        excluded = self._take_out(lost, fault, lost_text, leave)
        if fault is not None:
            self._close(f"the first node, which hosts the rendezvous, was taken out ({fault.reason})", excluded)
            return
        skipped: set[int] = set()
        while True:
            with self._lock:
                gone = self._dead | self._out | skipped
                waiting = [self._members[i] for i in sorted(self._members) if i not in self._world and i not in gone]
                world = next_world(self._world, gone, waiting, self.spec)
                silent = [m for m in waiting if m.member_id in world and not self._answered(m.member_id, asked)]
            if not silent:
                break
            if time.monotonic() - asked < self.keepalive_s:
                time.sleep(_POLL_S)
                continue
            for m in silent:
                skipped.add(m.member_id)
                kind = "standby" if m.standby else "waiting launcher"
                self.say(
                    f"{kind} {m.token.split(' #')[0]} did not answer within {self.keepalive_s:g} s (--keepalive-s): "
                    "skipped; the world re-forms with the nodes that are there"
                )
        with self._lock:
            if len(world) < self.spec.min_nodes:
                self._close(f"{len(world)} node(s) left, fewer than MIN (--nnodes {self.spec.text})", excluded)
                return
            self._publish(world, excluded)

    def _take_out(
        self, lost: set[int], fault: Fault | None, lost_text: str, leave: tuple[Leave, ...]
    ) -> tuple[Exclusion, ...]:
        """(The first node, at a re-forming.) Every node that leaves the job for good: the lost ones,
        this node for its own ``fault``, those its launcher names (``leave``) and the members that say
        they leave (each waited for); the live ones are told (``out/<member id>``)."""
        members = {i for i in self._world if i != self.member_id and i not in self._dead}
        said = members_faults(self.store, self.round, members, self._is_dead, self.timeout_s, self.say)
        leaving: dict[int, tuple[Fault, float | None]] = {i: (f, None) for i, f in said.items()}
        for named in leave:
            if named.node_rank < len(self._world):
                fault_of = Fault(named.reason, named.evidence)
                leaving.setdefault(self._world[named.node_rank], (fault_of, named.step_time_before_s))
        if fault is not None:
            leaving[self.member_id] = (fault, None)
        for i in lost:
            leaving.setdefault(i, (Fault("node-lost", lost_text or "its launcher is gone"), None))
        out = []
        with self._lock:
            for i, (why, before_s) in sorted(leaving.items()):
                x = self.exclusions.take_out(self._members[i], why, self.round, before_s)
                out.append(x)
                self._out.add(i)
                if i != self.member_id and i not in self._dead:
                    self.store.set(f"out/{i}", json.dumps(to_json(x)))
        return tuple(out)

    def _is_dead(self, member_id: int) -> bool:
        with self._lock:
            return member_id in self._dead

    def _close(self, why: str, excluded: tuple[Exclusion, ...]) -> None:
        """No next world (``why``); the nodes taken out at this re-forming are published with it."""
        record = {"closed": why, "excluded": [to_json(x) for x in excluded]}
        self.store.set(f"w/{self.round + 1}", json.dumps(record))
        self.store.set("round", str(self.round + 1))
        self._announce()

    def _announce(self) -> None:
        """A change the waiting members look for was made: ``news/<k>`` wakes each one's blocking wait
        (agents/elastic.py's ``await_world``), then the counter ``news`` says k (a member reads it first)."""
        self._news += 1
        self.store.set(f"{NEWS}/{self._news}", "1")
        self.store.set_counter(NEWS, self._news)

    def _ping_waiting(self) -> float:
        """(Under the lock.) Ask every waiting member whether its launcher runs; when it was asked."""
        at = time.monotonic()
        if self._port is not None:
            for m in self._idle():
                self._port.ask(m.member_id)
        return at

    def _answered(self, member_id: int, since: float) -> bool:
        return self._port is None or self._port.answered_since(member_id, since)

    def _publish(self, world: tuple[int, ...], excluded: tuple[Exclusion, ...] = ()) -> None:
        """World ``round + 1`` (under the lock), with the nodes taken out at its re-forming."""
        self._world = world
        tokens = [self._members[i].token for i in world]
        nodes = [self._members[i].node for i in world]
        record = {"members": list(world), "tokens": tokens, "nodes": nodes, "excluded": [to_json(x) for x in excluded]}
        self.store.set(f"w/{self.round + 1}", json.dumps(record))
        self.store.set("round", str(self.round + 1))
        self._announce()
