"""Elastic membership's store side (``--nnodes MIN:MAX``), in the agent's helper process
(agents/store_loop.py): the rendezvous, the first node's liveness watch, and each world's forming.

Every launcher registers as a member (agents/membership.py); the rendezvous host (the first node,
member 0) forms each world and publishes it; the others wait for the newest world that holds them.
Each world n then runs the fixed-size protocol (agents/fate.py's keys, under the scope ``r<n>/``):
meet, one fate, every node's end. Every other member keeps a TCP connection to the first node's
liveness port (agents/liveness.py: authenticated by the job's secret; anything else is dropped and
counted): a member whose launcher dies (its helper dies with it, PR_SET_PDEATHSIG) closes it, and the
first node sees that at once. A member is admitted only after its admission fingerprint agrees with
the first node's (agents/admission.py): one that differs is refused and the running world never hears
of it. A lost node of the running world is that world's fate ``lost`` and its ``end`` (so no node
waits for it); a member that arrives while a world runs is the fate ``reform`` when the world has
room for it and restarts are left. Both restart every node's workers in the next world; a waiting
member the next world would take (a standby) that does not beat on its link within
``--keepalive-s`` is skipped. A cut link without a close is found by the keep-alives.

Keys (``store.PREFIX`` + ...): ``el/id`` (the rendezvous id of the job at this endpoint; a launcher
of another ``--rdzv-id`` is refused, touching nothing), and under ``el/<rdzv-id>/``: ``spec`` (the
host's MIN:MAX), ``secret`` (the job's secret when ``OPENCLAW_JOB_SECRET`` is not set), ``count``
(member ids by arrival), ``master_port`` (node rank 0's free port), ``live_port`` (the first node's
liveness port), ``w/<n>`` (world n: member ids and tokens by node rank, or why there is none),
``round`` (the newest world's n), ``done`` (the job ended), ``bye/<id>`` (a waiting member saw it),
``news`` and ``news/<k>`` (the first node's k-th change that a waiting member looks for: a world
published or closed, the job's end) and ``r<n>/...`` (world n's keys).

A waiting member (a standby, an arrival, every node between two worlds) costs the store O(1) while
nothing changes: one blocking wait on ``news/<k+1>`` (k: the counter ``news`` it read), answered the
moment the first node sets it, else cancelled after ``NEWS_WAIT_S`` or at once when the first node
asks on its liveness link: two store requests a ``NEWS_WAIT_S`` (2 a second); at each change, the
counter and its few keys once (docs/multinode.md's cost table).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from openclaw_launch.agents.admission import admission_print, refusal
from openclaw_launch.agents.elastic_reform import NEWS, WorldForming
from openclaw_launch.agents.exclusions import Exclusions, refused_text
from openclaw_launch.agents.fate import EXIT_NODE_LOST, Fate
from openclaw_launch.agents.job_secret import JobKey
from openclaw_launch.agents.liveness import BEAT, PING, PONG, LivenessServer, connect
from openclaw_launch.agents.meeting import WAIT_NOTE_S
from openclaw_launch.agents.membership import (
    ID_KEY,
    ElasticSpec,
    Member,
    exclusion_refusal,
    first_world,
    namespace,
    wants_growth,
)
from openclaw_launch.agents.store import AgentError, AgentStore
from openclaw_launch.config.defaults import KEEPALIVE_S

REFORM = "reform"  # the fate of a world that takes in a node that arrived (agents/fate.py's Fate.kind)
EXCLUDE = "exclude"  # the fate of a world whose straggler node the first node takes out (agents/straggler_policy.py)
_POLL_S = 0.05
_BYE_WAIT_S = 5.0  # at the end, how long the first node waits for the waiting members to see it
_BEAT_S = 0.5  # a waiting member's beat on its liveness link (while its launcher ticks), at most this often
NEWS_WAIT_S = 1.0  # a waiting member's one blocking wait for the first node's next change, at most this long


def world_scope(round_number: int) -> str:
    """The keys of world ``round_number``'s fixed-size protocol."""
    return f"r{round_number}/"


class Rendezvous(WorldForming):
    """One launcher's side of the membership; the first node's also watches and forms the worlds.
    ``store``: the unscoped store (the helper's main thread uses it; the liveness thread has its own
    client). ``say``: a line for the launcher's console. ``rdzv_id``: the job's ``--rdzv-id``
    (torchrun's default ``none``): every key is under it, and a launcher of another id is refused."""

    def __init__(
        self,
        store: AgentStore,
        spec: ElasticSpec,
        max_restarts: int,
        timeout_s: float,
        say: Callable[[str], None],
        rdzv_id: str = "none",
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self.rdzv_id = rdzv_id
        self.namespace = namespace(rdzv_id)
        self._root = store
        self.store, self.spec, self.max_restarts, self.timeout_s, self.say = (
            store.within(self.namespace),
            spec,
            max_restarts,
            timeout_s,
            say,
        )
        self.keepalive_s = keepalive_s
        self.member_id = 0
        self.round = -1  # the newest world this launcher was in
        self.names: tuple[str, ...] = ()  # the current world's node names by rank (agents/fate.py's fates)
        self._lock = threading.Lock()  # the first node: what the liveness thread and the main thread share
        self._members: dict[int, Member] = {}
        self._news = 0  # the first node's changes so far (``_announce``)
        self._dead: set[int] = set()
        self._world: tuple[int, ...] = ()
        self._running = False
        self._keep: socket.socket | None = None  # a member's liveness connection, open while it lives
        self._last_beat = 0.0
        self._beat_ticks = 0  # the launcher's ticks at the last beat
        self._asked_at: int | None = None  # the launcher's ticks when the first node's PING came
        self._own: AgentStore | None = None
        self._port: LivenessServer | None = None  # the first node's liveness port
        self._admission: dict[str, str] = {}
        self._pinged_at: float | None = None  # the waiting members were asked at this world's fate
        self.exclusions = Exclusions()  # the first node: the nodes taken out for good
        self._out: set[int] = set()  # their members

    def world_scope(self, round_number: int) -> str:
        """The keys of world ``round_number``'s fixed-size protocol (under this job's namespace)."""
        return self.namespace + world_scope(round_number)

    # ---- arrival ---------------------------------------------------------------------------------

    def register(self, token: str, standby: bool, master_port: int, node: str) -> None:
        """Join as a member: the first node sets up the rendezvous, any other checks it is this
        kind of job, this job (its ``--rdzv-id``) and that it agrees with it (agents/admission.py),
        and connects its liveness link, authenticated by the job's secret (agents/liveness.py)."""
        store = self.store
        self._admission = admission_print(os.environ)
        if store.is_host:
            if standby:
                raise AgentError(
                    "--standby: this launcher hosts the rendezvous (the first node, node rank 0), which is never "
                    "a standby; start standbys on other hosts; started nothing"
                )
            key = JobKey.for_host(os.environ)
            self._members[0] = Member(0, token, False, node)
            if key.published is not None:
                store.set("secret", key.published)
            store.set("spec", self.spec.text)
            store.set("master_port", str(master_port))
            store.set_counter(NEWS, 0)
            self._port = LivenessServer(key, self.rdzv_id, self._admit, self._on_gone, self.say, self._joined)
            store.set("live_port", str(self._port.start(store.addr)))
            self._root.set(ID_KEY, self.rdzv_id)  # last: a launcher that sees it finds the rest
            return
        where = f"{store.addr}:{store.port}"
        until = time.monotonic() + self.timeout_s
        while not self._root.has([ID_KEY]):
            if self._root.has(["master_port"]) or time.monotonic() > until:
                raise AgentError(
                    f"--nnodes {self.spec.text}: the job at {where} is not elastic (its first node has a fixed "
                    "--nnodes N): give every node the same --nnodes; started nothing"
                )
            time.sleep(_POLL_S)
        theirs_id = self._root.get(ID_KEY)
        if theirs_id != self.rdzv_id:
            raise AgentError(
                f"--rdzv-id {self.rdzv_id}, but the job at {where} is --rdzv-id {theirs_id}: another job's "
                "rendezvous (give each job its own endpoint, or this job's id); that job is untouched, started nothing"
            )
        theirs = store.get("spec")
        if theirs != self.spec.text:
            raise AgentError(
                f"--nnodes {self.spec.text}, but the job at {where} runs --nnodes {theirs}: give every node the "
                "same MIN:MAX; started nothing"
            )
        key = JobKey.for_member(os.environ, store.get("secret") if store.has(["secret"]) else "")
        self.member_id = store.add("count", 1)
        record = {
            "id": self.member_id,
            "token": token,
            "standby": standby,
            "node": node,
            "admission": self._admission,
        }
        port = int(store.get("live_port"))
        self._keep = connect(store.addr, port, key, self.rdzv_id, record, self.timeout_s)

    def beat(self, ticks: int) -> None:
        """A member, ``ticks`` its launcher's loop's ticks so far: a beat to the first node when one
        came since the last (at most every ``_BEAT_S``), and ``PONG`` once two came after its ``PING``
        (a tick read just after the question may have been sent before the launcher froze)."""
        if self._keep is None:
            return
        with contextlib.suppress(OSError):
            self._keep.setblocking(False)
            try:
                heard: bytes | None = self._keep.recv(256)
            except BlockingIOError:
                heard = None  # nothing came
            if heard == b"":  # the first node closed the link (it ended): nothing to beat on, nor to wake a wait
                self._keep.close()
                self._keep = None
                return
            asked = heard is not None and PING in heard
            if asked and self._asked_at is None:
                self._asked_at = ticks
            now = time.monotonic()
            if ticks > self._beat_ticks and now - self._last_beat >= _BEAT_S:
                self._last_beat, self._beat_ticks = now, ticks
                self._keep.send(BEAT)
            if self._asked_at is not None and ticks >= self._asked_at + 2:
                self._asked_at = None
                self._keep.send(PONG)

    def form_first(self) -> None:
        """The first node: wait for MIN active members (``--agent-timeout-s``), then for more until
        MAX are there or ``last_call_timeout`` has passed, and publish world 0."""
        start = time.monotonic()
        noted, full_since = start, None
        while True:
            with self._lock:
                members = [self._members[i] for i in sorted(self._members)]
            active = sum(not m.standby for m in members)
            now = time.monotonic()
            if active >= self.spec.min_nodes and full_since is None:
                full_since = now
            if active >= self.spec.max_nodes or (
                full_since is not None and now - full_since >= self.spec.last_call_timeout_s
            ):
                break
            if full_since is None and now - start > self.timeout_s:
                raise AgentError(
                    f"--nnodes {self.spec.text}: {active} node(s) arrived in {self.timeout_s:g} s "
                    "(--agent-timeout-s), fewer than MIN; started nothing"
                )
            if now - noted >= WAIT_NOTE_S:
                noted = now
                self.say(f"{active} node(s) here (--nnodes {self.spec.text}): waiting for more")
            time.sleep(_POLL_S)
        with self._lock:
            self._publish(first_world(members, self.spec))

    # ---- every world -----------------------------------------------------------------------------

    def await_world(self, ticks: Callable[[], int]) -> dict[str, Any]:
        """The newest world after this launcher's last that holds it: ``rank``, ``nnodes``,
        ``master_port``, ``round``, ``tokens``, ``nodes`` (config node names, by node rank); or
        ``done`` (the job ended without it), or ``closed`` (fewer than MIN nodes are left). It looks
        at each of the first node's changes (``news/<k>``), blocked on the store in between; while it
        waits, it beats on its liveness link as long as its launcher's loop runs (``ticks()``: its
        ticks so far), and answers the first node's question within two ticks."""
        while True:
            seen = int(self.store.get_counters([NEWS])[0])  # read before the keys: a later change is news/seen+1
            answer = self._world_news()
            if answer is not None:
                return answer
            while True:
                self.beat(ticks())
                wait_s = _POLL_S if self._asked_at is not None else NEWS_WAIT_S  # asked: its ticks, soon
                if self.store.wait([f"{NEWS}/{seen + 1}"], wait_s, self._keep):
                    break

    def _world_news(self) -> dict[str, Any] | None:
        """``await_world``'s answer from the store as it is now, or None (nothing for this launcher yet)."""
        store = self.store
        if store.has([f"out/{self.member_id}"]):  # this node was taken out of the job
            return {"out": json.loads(store.get(f"out/{self.member_id}"))}
        if store.has(["done"]):
            store.set(f"bye/{self.member_id}", "1")
            return {"done": True}
        newest = int(store.get("round")) if store.has(["round"]) else -1
        if newest <= self.round:
            return None
        world = json.loads(store.get(f"w/{newest}"))
        if "closed" in world:
            return {"closed": world["closed"], "excluded": world.get("excluded", [])}
        if self.member_id not in world["members"]:
            return None
        self.round = newest
        return {
            "rank": world["members"].index(self.member_id),
            "nnodes": len(world["members"]),
            "master_port": int(store.get("master_port")),
            "round": newest,
            "tokens": world["tokens"],
            "nodes": world["nodes"],
            "excluded": world.get("excluded", []),
        }

    def exclude(self, node_rank: int, fate: Fate) -> str | None:
        """The first node: stop the running world to take node rank ``node_rank`` out (the straggler policy,
        agents/straggler_actions.py): its ``fate`` (``exclude``) stops every node's workers after its grace;
        the agent's ``take_out`` leaves it out of the next world. None, or why not (the world runs on)."""
        with self._lock:
            left = self.max_restarts - self.round
            why = exclusion_refusal(self._world, node_rank, self._dead | self._out, self._idle(), self.spec, left)
            if why is None and not self._running:
                why = "the world is not running"
            if why is not None:
                return why
            if self._fate_store().first(f"fate/{self.round}", fate.to_json()) != fate.to_json():
                return "the world stops for another reason first"
            self._pinged_at = self._pinged_at or self._ping_waiting()
        return None

    def running(self) -> None:
        """The newest world's workers start: from now on a loss or an arrival stops them."""
        with self._lock:
            self._running = True
            self._maybe_grow(self._fate_store())

    def finish(self) -> None:
        """The job ended: waiting members (standbys) stop waiting; the store stays up until each has
        seen it (at most ``_BYE_WAIT_S``)."""
        with self._lock:
            waiting = [f"bye/{m.member_id}" for m in self._idle()]
        if self._port is not None and (dropped := self._port.summary()):
            self.say(dropped)
        with contextlib.suppress(Exception):
            self.store.set("done", "1")
            self._announce()
            until = time.monotonic() + _BYE_WAIT_S
            while waiting and not self.store.has(waiting) and time.monotonic() < until:
                time.sleep(_POLL_S)

    # ---- the first node's liveness port (its thread: agents/liveness.py) --------------------------

    def _fate_store(self) -> AgentStore:
        """(Under the lock.) The first node's own client for the liveness thread, in this world's scope."""
        if self._own is None:
            self._own = AgentStore(self.store.addr, self.store.port, False, self.timeout_s)
        return self._own.within(self.world_scope(self.round))

    def _admit(self, member_id: int, record: dict[str, Any]) -> str | None:
        """An authenticated member: refused if it does not agree with this job (nothing else is
        touched), else a member (a standby waits; an active one may re-form a running world)."""
        who = f"the launcher {record['token'].split(' #')[0]}" + (f" (node {record['node']})" if record["node"] else "")
        why = refusal(self._admission, record["admission"], who)
        if why is not None:
            self.say(f"refused {who}: it does not agree with this job (it was told each difference)")
            return why
        with self._lock:
            taken_out = self.exclusions.of(record["node"], record["token"])
            if taken_out is not None:
                self.say(f"refused {who}: {taken_out.line}: not admitted again")
                return refused_text(taken_out)
            if member_id in self._members or member_id in self._dead:
                return f"member {member_id} of --rdzv-id {self.rdzv_id} joined already; started nothing"
            node = record["node"]
            live = [m for m in self._members.values() if m.member_id not in self._dead]
            holder = next((m for m in live if node and m.node == node), None)
            if holder is not None:  # a config node runs once: the second launcher for it goes, not the job
                return (
                    f"node {node} already joined this job (its launcher: {holder.token.split(' #')[0]}): a second "
                    "launcher for it is refused; the running job is untouched, started nothing"
                )
            self._members[member_id] = Member(member_id, record["token"], record["standby"], record["node"])
            if record["standby"]:
                self.say(f"standby {record['token'].split(' #')[0]} joined: it runs no ranks until a node is lost")
        return None

    def _joined(self, member_id: int) -> None:
        """A member's link is up: an active one may re-form a running world (and be asked on its link)."""
        with self._lock:
            if self._running:
                self._maybe_grow(self._fate_store())

    def _maybe_grow(self, store: AgentStore) -> None:
        """(Under the lock.) A member waits to run ranks and the world has room: re-form."""
        waiting = self._idle()
        if not (self._running and self.round < self.max_restarts and wants_growth(self._world, waiting, self.spec)):
            return
        text = f"a node joined (--nnodes {self.spec.text}, {len(self._world)} running): re-forming the world"
        fate = Fate(REFORM, self.names[0] if self.names else "", None, EXIT_NODE_LOST, text)
        store.first(f"fate/{self.round}", fate.to_json())
        self._pinged_at = self._pinged_at or self._ping_waiting()  # answered by the time the world has stopped

    def _on_gone(self, member_id: int) -> None:
        with self._lock:
            member = self._members.get(member_id)  # kept: a lost node is taken out by its name (agents/exclusions.py)
            self._dead.add(member_id)
            if member is None or member_id not in self._world or not self._running:
                return
            rank = self._world.index(member_id)
            store = self._fate_store()
            if store.has([f"end/{self.round}/{rank}"]):  # it was done with this world (its workers ended)
                return
            name = self.names[rank] if rank < len(self.names) else f"node rank {rank}"
            text = f"node {name} is lost (its launcher {member.token.split(' #')[0]} closed its link to the first node)"
            store.first(f"fate/{self.round}", Fate("lost", name, None, EXIT_NODE_LOST, text).to_json())
            self._pinged_at = self._pinged_at or self._ping_waiting()
            store.set(f"end/{self.round}/{rank}", "lost")  # no node waits for its end
