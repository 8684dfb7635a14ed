"""Elastic membership's store side (``--nnodes MIN:MAX``), in the agent's helper process
(agents/store_loop.py): the rendezvous, the first node's liveness watch, and each world's forming.

Every launcher registers as a member (agents/membership.py); the rendezvous host (the first node,
member 0) forms each world and publishes it; the others wait for the newest world that holds them.
Each world n then runs the fixed-size protocol (agents/fate.py's keys, under the scope ``r<n>/``):
meet, one fate, every node's end. Every other member keeps a TCP connection to the first node's
helper: a member whose launcher dies (its helper dies with it, PR_SET_PDEATHSIG) closes it, and the
first node sees that at once. A lost node of the running world is that world's fate ``lost`` and its
``end`` (so no node waits for it); a member that arrives while a world runs is the fate ``reform``
when the world has room for it and restarts are left. Both restart every node's workers in the next
world. A cut link without a close is found by the keep-alives (``--keepalive-s``), as before.

Keys (``store.PREFIX`` + ``el/`` + ...): ``spec`` (the host's MIN:MAX), ``count`` (member ids by
arrival), ``m/<id>`` (a member: its token, standby flag and config node), ``master_port`` (node rank 0's free
port), ``live_port`` (the first node's liveness port), ``w/<n>`` (world n: member ids and tokens
by node rank, or why there is none), ``round`` (the newest world's n), ``done`` (the job ended) and
``bye/<id>`` (a waiting member saw it).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from openclaw_launch.agents.fate import EXIT_NODE_LOST, Fate
from openclaw_launch.agents.meeting import WAIT_NOTE_S
from openclaw_launch.agents.membership import ElasticSpec, Member, first_world, next_world, wants_growth
from openclaw_launch.agents.store import AgentError, AgentStore

REFORM = "reform"  # the fate of a world that takes in a node that arrived (agents/fate.py's Fate.kind)
_POLL_S = 0.05
_BYE_WAIT_S = 5.0  # at the end, how long the first node waits for the waiting members to see it
_SCOPE = "el/"


def world_scope(round_number: int) -> str:
    """The keys of world ``round_number``'s fixed-size protocol."""
    return f"r{round_number}/"


class Rendezvous:
    """One launcher's side of the membership; the first node's also watches and forms the worlds.
    ``store``: the unscoped store (the helper's main thread uses it; the liveness thread has its own
    client). ``say``: a line for the launcher's console."""

    def __init__(
        self, store: AgentStore, spec: ElasticSpec, max_restarts: int, timeout_s: float, say: Callable[[str], None]
    ) -> None:
        self.store, self.spec, self.max_restarts, self.timeout_s, self.say = (
            store.within(_SCOPE),
            spec,
            max_restarts,
            timeout_s,
            say,
        )
        self.member_id = 0
        self.round = -1  # the newest world this launcher was in
        self.names: tuple[str, ...] = ()  # the current world's node names by rank (agents/fate.py's fates)
        self._lock = threading.Lock()  # the first node: what the liveness thread and the main thread share
        self._members: dict[int, Member] = {}
        self._dead: set[int] = set()
        self._world: tuple[int, ...] = ()
        self._running = False
        self._keep: socket.socket | None = None  # a member's liveness connection, open while it lives
        self._own: AgentStore | None = None

    # ---- arrival ---------------------------------------------------------------------------------

    def register(self, token: str, standby: bool, master_port: int, node: str) -> None:
        """Join as a member: the first node sets up the rendezvous, any other checks it is this
        kind of job and connects its liveness link."""
        store = self.store
        if store.is_host:
            if standby:
                raise AgentError(
                    "--standby: this launcher hosts the rendezvous (the first node, node rank 0), which is never "
                    "a standby; start standbys on other hosts; started nothing"
                )
            self._members[0] = Member(0, token, False, node)
            store.set("spec", self.spec.text)
            store.set("master_port", str(master_port))
            store.set("live_port", str(self._listen()))
            return
        where = f"{store.addr}:{store.port}"
        until = time.monotonic() + self.timeout_s
        while not store.has(["spec", "live_port"]):
            if store.within("").has(["master_port"]) or time.monotonic() > until:
                raise AgentError(
                    f"--nnodes {self.spec.text}: the job at {where} is not elastic (its first node has a fixed "
                    "--nnodes N): give every node the same --nnodes; started nothing"
                )
            time.sleep(_POLL_S)
        theirs = store.get("spec")
        if theirs != self.spec.text:
            raise AgentError(
                f"--nnodes {self.spec.text}, but the job at {where} runs --nnodes {theirs}: give every node the "
                "same MIN:MAX; started nothing"
            )
        self.member_id = store.add("count", 1)
        store.set(f"m/{self.member_id}", json.dumps({"token": token, "standby": standby, "node": node}))
        self._keep = socket.create_connection((store.addr, int(store.get("live_port"))), timeout=self.timeout_s)
        self._keep.sendall(f"{self.member_id}\n".encode())

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

    def await_world(self) -> dict[str, Any]:
        """The newest world after this launcher's last that holds it: ``rank``, ``nnodes``,
        ``master_port``, ``round``, ``tokens``, ``nodes`` (config node names, by node rank); or
        ``done`` (the job ended without it), or ``closed`` (fewer than MIN nodes are left)."""
        store = self.store
        while True:
            if store.has(["done"]):
                store.set(f"bye/{self.member_id}", "1")
                return {"done": True}
            newest = int(store.get("round")) if store.has(["round"]) else -1
            if newest > self.round:
                world = json.loads(store.get(f"w/{newest}"))
                if "closed" in world:
                    return {"closed": world["closed"]}
                if self.member_id in world["members"]:
                    self.round = newest
                    return {
                        "rank": world["members"].index(self.member_id),
                        "nnodes": len(world["members"]),
                        "master_port": int(store.get("master_port")),
                        "round": newest,
                        "tokens": world["tokens"],
                        "nodes": world["nodes"],
                    }
            time.sleep(_POLL_S)

    def reform(self, lost_ranks: set[int]) -> None:
        """The first node, after world ``round`` ended: publish the next from its survivors (less
        ``lost_ranks``, the fate's lost node), the standbys and the members that arrived."""
        with self._lock:
            self._running = False
            self._dead |= {self._world[r] for r in lost_ranks if r < len(self._world)}  # for good: a cut link
            gone = self._dead
            waiting = [self._members[i] for i in sorted(self._members) if i not in self._world and i not in gone]
            world = next_world(self._world, gone, waiting, self.spec)
            if len(world) < self.spec.min_nodes:
                self.store.set(
                    f"w/{self.round + 1}",
                    json.dumps({"closed": f"{len(world)} node(s) left, fewer than MIN (--nnodes {self.spec.text})"}),
                )
                self.store.set("round", str(self.round + 1))
                return
            self._publish(world)

    def running(self) -> None:
        """The newest world's workers start: from now on a loss or an arrival stops them."""
        with self._lock:
            self._running = True
            self._maybe_grow(self._fate_store())

    def finish(self) -> None:
        """The job ended: waiting members (standbys) stop waiting; the store stays up until each has
        seen it (at most ``_BYE_WAIT_S``)."""
        with self._lock:
            waiting = [f"bye/{i}" for i in self._members if i not in self._world and i not in self._dead]
        with contextlib.suppress(Exception):
            self.store.set("done", "1")
            until = time.monotonic() + _BYE_WAIT_S
            while waiting and not self.store.has(waiting) and time.monotonic() < until:
                time.sleep(_POLL_S)

    def _publish(self, world: tuple[int, ...]) -> None:
        """World ``round + 1`` (under the lock)."""
        self._world = world
        tokens = [self._members[i].token for i in world]
        nodes = [self._members[i].node for i in world]
        self.store.set(f"w/{self.round + 1}", json.dumps({"members": list(world), "tokens": tokens, "nodes": nodes}))
        self.store.set("round", str(self.round + 1))

    # ---- the first node's liveness watch (a thread with its own store client) ---------------------

    def _listen(self) -> int:
        listener = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        threading.Thread(target=self._watch, args=(listener,), name="openclaw-members", daemon=True).start()
        return int(listener.getsockname()[1])

    def _fate_store(self) -> AgentStore:
        """(Under the lock.) The first node's own client for the liveness thread, in this world's scope."""
        if self._own is None:
            self._own = AgentStore(self.store.addr, self.store.port, False, self.timeout_s)
        return self._own.within(world_scope(self.round))

    def _watch(self, listener: socket.socket) -> None:
        links: dict[socket.socket, tuple[int | None, bytes]] = {}
        while True:
            readable, _, _ = select.select([listener, *links], [], [])
            for sock in readable:
                if sock is listener:
                    conn, _ = listener.accept()
                    links[conn] = (None, b"")
                    continue
                member_id, got = links[sock]
                data = b""
                with contextlib.suppress(OSError):
                    data = sock.recv(256)
                if not data:
                    del links[sock]
                    sock.close()
                    if member_id is not None:
                        self._on_gone(member_id)
                    continue
                got += data
                if member_id is None and b"\n" in got:
                    member_id = int(got.split(b"\n")[0])
                    self._on_arrived(member_id)
                links[sock] = (member_id, got)

    def _on_arrived(self, member_id: int) -> None:
        with self._lock:
            record = json.loads(self._fate_store().within(_SCOPE).get(f"m/{member_id}"))
            self._members[member_id] = Member(member_id, record["token"], record["standby"], record["node"])
            if record["standby"]:
                self.say(f"standby {record['token'].split(' #')[0]} joined: it runs no ranks until a node is lost")
            if self._running:
                self._maybe_grow(self._fate_store())

    def _maybe_grow(self, store: AgentStore) -> None:
        """(Under the lock.) A member waits to run ranks and the world has room: re-form."""
        waiting = [self._members[i] for i in sorted(self._members) if i not in self._world and i not in self._dead]
        if not (self._running and self.round < self.max_restarts and wants_growth(self._world, waiting, self.spec)):
            return
        text = f"a node joined (--nnodes {self.spec.text}, {len(self._world)} running): re-forming the world"
        fate = Fate(REFORM, self.names[0] if self.names else "", None, EXIT_NODE_LOST, text)
        store.first(f"fate/{self.round}", fate.to_json())

    def _on_gone(self, member_id: int) -> None:
        with self._lock:
            member = self._members.pop(member_id, None)
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
            store.set(f"end/{self.round}/{rank}", "lost")  # no node waits for its end
