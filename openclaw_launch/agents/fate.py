"""The node agent: meet before start, one fate while running, restart in lockstep, report once.

Keys in the store (``store.PREFIX`` + ...), ``r`` a node rank, ``a`` an attempt:

- ``hb/r``      keep-alive counter, bumped every tick by node r's agent thread
- ``fp/r``      node r's fingerprint (JSON); ``ack/r``: node r has compared them
- ``fate/a``    the first stop of attempt a anywhere (first writer wins: compare-and-set):
                ``{"kind": "failure"|"signal"|"hang"|"lost", "node", "rank", "code", "text"}``
- ``end/a/r``   node r's workers of attempt a are gone, with its own outcome: ``ok``, ``stopped``
                (by the fate), or the kind of its own first reason that vetoes a restart
                (``signal``/``hang``), else of its first (``failure``)
- ``report/r``  node r's report and statistics, for the first node's job report

The store traffic runs on one thread; it talks to the supervisor's event loop through a pipe
(``readers``), so a slow or cut network never blocks the loop. The agent is a supervision
``Participant`` (run/participant.py): told this node's stop reasons (``on_stop``), it publishes the
first as the fate; another node's fate is its ``stop_reason``; it holds each attempt until every
node is done with it; its ``vote_restart`` is the job's decision.

Restarts are decided once, the same on every node: after attempt a every node waits until each
node's ``end/a/r`` is there (or a node is lost); the job restarts iff this node wishes it, ``fate/a``
is a worker failure, and no node's outcome vetoes it (a signal or a hang anywhere, even one that
came second). Then every node restarts (same backoff), or none does. A hang is the job's fate like
a failure: every node stops and exits 124.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from openclaw_launch.agents.fingerprint import differences
from openclaw_launch.agents.store import AgentError, AgentStore
from openclaw_launch.config import defaults
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run.participant import Participant, StopKind, StopReason

EXIT_NODE_LOST = 1  # the job's exit code on the surviving nodes when a node was lost


@dataclass(frozen=True)
class AgentOptions:
    store_addr: str  # where the first node's agent listens (its config ip, or MASTER_ADDR)
    port: int
    nodes: tuple[str, ...]  # config order: node rank -> name
    join_timeout_s: float = defaults.AGENT_TIMEOUT_S
    keepalive_s: float = defaults.KEEPALIVE_S
    max_restarts: int = 0


@dataclass(frozen=True)
class Fate:
    kind: str  # failure | signal | hang | lost (StopKind's values)
    node: str
    rank: int | None
    code: int
    text: str  # what every node prints

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> Fate:
        return cls(**json.loads(text))

    @property
    def headline(self) -> str:
        return self.text.splitlines()[0] if self.text else self.kind

    @property
    def restartable(self) -> bool:
        return self.kind == StopKind.FAILURE.value


# A node's end outcome that does not stop the job from restarting; any other (signal, hang) does.
_RESTARTABLE_OUTCOMES = frozenset({"ok", "stopped", StopKind.FAILURE.value})


class Agent(Participant):
    def __init__(self, plan: LaunchPlan, options: AgentOptions, say: Callable[[str], None]) -> None:
        self.plan, self.opt, self.say = plan, options, say
        self.me = plan.node_rank
        self.name = plan.node
        self.is_host = self.me == 0
        self.store: AgentStore | None = None
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._commands: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.attempt = 0
        self.fates: dict[int, Fate] = {}  # the job's fate per attempt, as this node knows it
        self.ended: set[int] = set()  # attempts every node is done with
        self._end_sent: set[int] = set()
        self._local: dict[int, str] = {}  # this node's outcome per attempt
        self.outcomes: dict[int, tuple[str, ...]] = {}  # every node's end outcome per attempt, once all are in
        self.lost_nodes: set[str] = set()
        self._last_ok = 0.0
        self._abandoned = False  # the store thread is stuck on a call (the watchdog gave up on it)

    # ---- before start (main thread) --------------------------------------------------------------

    def join(self, fingerprint: Mapping[str, str], interrupted: Callable[[], int | None]) -> int | None:
        """Meet every node and compare fingerprints. Returns a signal number if one stopped the
        wait (nothing started), None when all agree; raises ``AgentError`` otherwise."""
        box: list[BaseException | None] = []
        worker = threading.Thread(target=lambda: box.append(self._join(fingerprint)), daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            sig = interrupted()
            if sig is not None:
                return sig
        if box and box[0] is not None:
            raise box[0]
        return None

    def _join(self, fingerprint: Mapping[str, str]) -> BaseException | None:
        try:
            self._meet(fingerprint)
        except AgentError as e:  # handed to the main thread
            return e
        except Exception as e:  # the store went away while meeting (the first node stopped)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return AgentError(f"lost the first node's agent while the nodes met: {first}; started nothing")
        return None

    def _meet(self, fingerprint: Mapping[str, str]) -> None:
        opt, n = self.opt, len(self.opt.nodes)
        self.store = store = AgentStore(opt.store_addr, opt.port, self.is_host, opt.join_timeout_s)
        store.set(f"hb/{self.me}", "0")
        store.set(f"fp/{self.me}", json.dumps({"node": self.name, "fingerprint": dict(fingerprint)}))
        deadline = time.monotonic() + opt.join_timeout_s
        keys = [f"fp/{r}" for r in range(n)]
        while not store.has(keys):
            if time.monotonic() > deadline:
                missing = [opt.nodes[r] for r in range(n) if not store.has([f"fp/{r}"])]
                raise AgentError(
                    f"node(s) {', '.join(missing)} never arrived: waited {opt.join_timeout_s:g} s at "
                    f"{opt.store_addr}:{opt.port} (--agent-timeout-s); started nothing"
                )
            time.sleep(0.1)
        prints = {}
        for text in store.get_many(keys):
            data = json.loads(text)
            prints[data["node"]] = data["fingerprint"]
        store.set(f"ack/{self.me}", "1")
        diff = differences(prints)
        if self.is_host:  # keep the store up until every node has read the fingerprints
            acks = [f"ack/{r}" for r in range(n)]
            until = time.monotonic() + min(opt.join_timeout_s, 30.0)
            while not store.has(acks) and time.monotonic() < until:
                time.sleep(0.05)
        if diff:
            raise AgentError("the nodes do not agree; started nothing on any node:\n  " + "\n  ".join(diff))
        store.set_timeout(opt.keepalive_s)

    def start(self) -> None:
        self._last_ok = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="openclaw-agent", daemon=True)
        self._thread.start()
        threading.Thread(target=self._watchdog, name="openclaw-agent-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        """A store call stuck on a cut link (its socket timeout is the join timeout) is a lost first
        node once it has taken longer than the keep-alive; the stuck thread is abandoned."""
        while not self._stop.wait(min(0.5, self.opt.keepalive_s / 4)):
            silent = time.monotonic() - self._last_ok
            if silent > self.opt.keepalive_s:
                self._abandoned = True
                host = self.opt.nodes[0]
                text = f"lost the first node {host}'s agent: no answer for {silent:.1f} s (--keepalive-s)"
                self._post("fate", (self.attempt, Fate("lost", host, None, EXIT_NODE_LOST, text)))
                self._post("ended", self.attempt)
                return

    # ---- supervisor hooks (main thread) ----------------------------------------------------------

    def fileno(self) -> int:
        return self._r

    def drain(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                kind, data = self._events.get_nowait()
            except queue.Empty:
                return
            if kind == "fate":
                self._on_fate(*data)
            elif kind == "ended":
                self.ended.add(data)
            elif kind == "outcomes":
                self.outcomes[data[0]] = tuple(data[1])

    def _on_fate(self, attempt: int, fate: Fate) -> None:
        if attempt in self.fates:
            return
        self.fates[attempt] = fate
        if fate.kind == "lost":
            self.lost_nodes.add(fate.node)
        if fate.node != self.name or fate.kind == "lost":
            self.say(f"openclaw-launch: {fate.text}")
            if attempt == self.attempt:
                self.say(f"openclaw-launch: stopping this node's ({self.name}) workers: one job, one fate")

    # ---- the attempt contract (run/participant.py) ------------------------------------------------

    def readers(self) -> dict[int, Callable[[], None]]:
        return {self.fileno(): self.drain}

    def begin_attempt(self, attempt: int) -> None:
        self.attempt = attempt

    def stop_reason(self) -> StopReason | None:
        """Another node's fate for this attempt (or a lost node): this node stops with its code."""
        fate = self.fates.get(self.attempt)
        if fate is None or (fate.node == self.name and fate.kind != StopKind.LOST.value):
            return None
        if fate.kind == StopKind.LOST.value:
            return StopReason(StopKind.LOST, EXIT_NODE_LOST, fate.text, False, fate.node, fate.rank)
        return StopReason(StopKind.REMOTE, fate.code, fate.text, fate.restartable, fate.node, fate.rank)

    def on_stop(self, reason: StopReason) -> None:
        """This node stops for a reason of its own: the first is published as the attempt's fate (it
        wins if no node's came first); a reason that vetoes restarts is this node's end outcome."""
        attempt = self.attempt
        outcome = self._local.get(attempt)
        if outcome is None or (outcome in _RESTARTABLE_OUTCOMES and not reason.restartable):
            self._local[attempt] = reason.kind.value
        if outcome is None and attempt not in self.fates:
            fate = Fate(reason.kind.value, self.name, reason.rank, reason.exit_code, f"node {self.name}: {reason.text}")
            self._commands.put(("fate", (attempt, fate)))

    def holds_attempt(self) -> bool:
        """True while another node is still running this attempt."""
        attempt = self.attempt
        if attempt not in self._end_sent:
            self._end_sent.add(attempt)
            outcome = self._local.get(attempt) or ("stopped" if attempt in self.fates else "ok")
            self._commands.put(("end", (attempt, outcome)))
        alive = self._thread is not None and self._thread.is_alive() and not self._abandoned
        return attempt not in self.ended and alive

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        """The job's decision, alike on every node: this node's wish, the fate a failure, and no
        node's outcome a veto (outcomes unknown, e.g. a node lost: the fate says lost anyway)."""
        fate = self.fates.get(attempt)
        vetoed = any(o not in _RESTARTABLE_OUTCOMES for o in self.outcomes.get(attempt, ()))
        return wish and fate is not None and fate.restartable and not vetoed

    # ---- the thread ------------------------------------------------------------------------------

    def _post(self, kind: str, data: Any) -> None:
        self._events.put((kind, data))
        with contextlib.suppress(BlockingIOError):  # the pipe is full of wake-ups already
            os.write(self._w, b"x")

    def _run(self) -> None:
        tick = max(min(0.2, self.opt.keepalive_s / 10), 0.02)
        beats = 0
        peers = [r for r in range(len(self.opt.nodes)) if r != self.me]
        last_seen: dict[int, tuple[str, float]] = {}
        posted_end = -1
        try:
            while not self._stop.is_set():
                store = self.store
                assert store is not None
                self._do_commands(store)
                beats += 1
                store.set(f"hb/{self.me}", str(beats))
                attempt = self.attempt
                self._watch_fate(store, attempt)
                ends = [f"end/{attempt}/{r}" for r in range(len(self.opt.nodes))]
                if store.has(ends) and attempt in self._end_sent and posted_end != attempt:
                    self._watch_fate(store, attempt)  # a fate is always written before its node's end
                    # every node's outcome: one that vetoes a restart (a hang, a signal) stops it everywhere
                    self._post("outcomes", (attempt, store.get_many(ends)))
                    self._post("ended", attempt)
                    posted_end = attempt
                now = time.monotonic()
                for r, beat in zip(peers, store.get_many([f"hb/{r}" for r in peers]), strict=True):
                    seen = last_seen.get(r)
                    if seen is None or seen[0] != beat:
                        last_seen[r] = (beat, now)
                    elif now - seen[1] > self.opt.keepalive_s and not store.has([f"end/{attempt}/{r}"]):
                        self._lost(store, attempt, self.opt.nodes[r], f"no keep-alive for {now - seen[1]:.1f} s")
                        return
                self._last_ok = time.monotonic()
                self._stop.wait(tick)
        except Exception as e:  # the store (the first node) is unreachable: this node is on its own
            if self._stop.is_set() or self._abandoned:
                return
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            host = self.opt.nodes[0]
            fate = Fate("lost", host, None, EXIT_NODE_LOST, f"lost the first node {host}'s agent: {first}")
            self._post("fate", (self.attempt, fate))
            self._post("ended", self.attempt)

    def _do_commands(self, store: AgentStore) -> None:
        while True:
            try:
                kind, data = self._commands.get_nowait()
            except queue.Empty:
                return
            if kind == "fate":
                attempt, fate = data
                won = Fate.from_json(store.first(f"fate/{attempt}", fate.to_json()))
                self._post("fate", (attempt, won))
            elif kind == "end":
                attempt, outcome = data
                store.set(f"end/{attempt}/{self.me}", outcome)

    def _watch_fate(self, store: AgentStore, attempt: int) -> None:
        if attempt not in self.fates and store.has([f"fate/{attempt}"]):
            self._post("fate", (attempt, Fate.from_json(store.get(f"fate/{attempt}"))))

    def _lost(self, store: AgentStore, attempt: int, node: str, why: str) -> None:
        text = f"node {node} is lost ({why}, --keepalive-s {self.opt.keepalive_s:g})"
        won = Fate.from_json(store.first(f"fate/{attempt}", Fate("lost", node, None, EXIT_NODE_LOST, text).to_json()))
        self._post("fate", (attempt, won))
        if won.kind == "lost":  # no end will come from a lost node
            self._post("ended", attempt)

    # ---- after the job (main thread) -------------------------------------------------------------

    def finish(self, payload: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
        """Hand this node's report to the first node. On the first node: every node's payloads
        (its own first; a node that never sent one is missing), else None."""
        self._stop.set()
        if self._thread is not None and not self._abandoned:
            self._thread.join(timeout=self.opt.keepalive_s + 1)
        store = self.store
        if store is None or self._abandoned or (self._thread is not None and self._thread.is_alive()):
            return None
        if not self.is_host:
            if self.opt.nodes[0] in self.lost_nodes:  # nobody to send it to (and a call could hang)
                return None
            try:
                store.set(f"report/{self.me}", json.dumps(payload))
            except Exception as e:
                self.say(f"openclaw-launch: warning: could not send this node's report to the first node: {e}")
            return None
        got: dict[int, Mapping[str, Any]] = {0: payload}
        wanted = [r for r in range(1, len(self.opt.nodes)) if self.opt.nodes[r] not in self.lost_nodes]
        deadline = time.monotonic() + max(10.0, 2 * self.opt.keepalive_s)
        while wanted and time.monotonic() < deadline:
            for r in [r for r in wanted if store.has([f"report/{r}"])]:
                got[r] = json.loads(store.get(f"report/{r}"))
                wanted.remove(r)
            time.sleep(0.05)
        return [got[r] for r in sorted(got)]

    def close(self) -> None:
        self._stop.set()
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
