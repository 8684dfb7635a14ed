"""The node agent's store traffic, in a helper process (run/helper.py): the launcher forks with one
thread, so the TCPStore client, its keep-alive loop and the watchdog run there, and torch (the
TCPStore) is imported there, never in the launcher.

The agent (agents/fate.py) forks the helper before the nodes meet and keeps the decisions; the
helper (``StoreLoop``, here) does the store calls and reports what it sees; the launcher's end is
agents/store_link.py's ``StoreLink``, and their messages are agents/store_messages.py's.

The keep-alive (``hb/r``) is the launcher's, not only this helper's: once the launcher's supervision
loop has ticked in an attempt (a ``Tick`` from its timer, agents/fate.py), a beat is written only
when a tick came since the last one. A launcher that is stopped (SIGSTOP) or wedged stops its beats
although this helper runs on, and the other nodes find it lost after ``--keepalive-s``. Before the
first tick of an attempt (its workers are starting) and after this node's end of it (teardown,
backoff: the other nodes no longer watch it for that attempt) the helper beats alone.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from openclaw_launch.agents.keepalive import WATCHER, KeepAlive, end_key
from openclaw_launch.agents.meeting import admit, arrive, meet
from openclaw_launch.agents.store import AgentError, AgentStore, import_tcpstore, open_store
from openclaw_launch.agents.store_messages import (
    Arrive,
    Arrived,
    BeginAttempt,
    Connected,
    Ended,
    FateOf,
    FinishJob,
    Join,
    Joined,
    JoinFailed,
    LoopEnded,
    Opening,
    PublishFate,
    Reports,
    Say,
    SendEnd,
    StartLoop,
    Tick,
)
from openclaw_launch.run.helper import Link, Message


class LoopOptions(Protocol):
    """What the loop reads of agents/fate.py's ``AgentOptions``."""

    @property
    def store_addr(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def join_timeout_s(self) -> float: ...
    @property
    def keepalive_s(self) -> float: ...


LostFate = Callable[[str, str], str]  # (lost node, text) -> the fate's JSON
_REPORTS_PER_READ = 64  # the first node reads the reports this many at a time (each may be tens of kB)


class StoreLoop:
    """The helper's side: the main thread follows the launcher's messages; the store loop and the
    watchdog are threads (the AgentStore is used by one thread at a time: the meeting, then the
    loop, then the report exchange)."""

    def __init__(self, link: Link, options: LoopOptions, lost_fate: LostFate) -> None:
        self.link, self.opt, self.lost_fate = link, options, lost_fate
        self.me, self.name = 0, ""  # from ``join``: this node's rank and name, and every node's name
        self.nodes: tuple[str, ...] = ()
        self.is_host = False
        self.store: AgentStore | None = None
        self.attempt = 0
        self._commands: queue.Queue[PublishFate | SendEnd] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._posted_fates: set[int] = set()
        self._end_sent: set[int] = set()
        self._last_ok = 0.0
        self._abandoned = False  # the loop is stuck on a call (the watchdog gave up on it)
        self._ticks = 0  # the launcher's loop ticks (``Tick``) so far
        self._armed = False  # this attempt's keep-alive counts the launcher's ticks (from its first)
        self._deferred: list[Message] = []  # read while a step waited (``_ticks_so_far``), handled after it

    def _post(self, message: Message) -> None:
        self.link.send(message)

    def _say(self, text: str) -> None:
        self._post(Say(text))

    def _post_fate(self, attempt: int, fate: str) -> None:
        if attempt not in self._posted_fates:
            self._posted_fates.add(attempt)
            self._post(FateOf(attempt, fate))

    def _ticks_so_far(self) -> int:
        """(In a waiting step.) The launcher's ticks read; how many came so far."""
        for message in self.link.wait(0.001):
            if isinstance(message, Tick):
                self._tick()
            else:
                self._deferred.append(message)
        return self._ticks

    def _tick(self) -> None:
        self._ticks += 1
        self._armed = self.attempt not in self._end_sent  # after its end the attempt's loop may stop

    def serve(self) -> None:
        while not self.link.closed or self._deferred:
            messages, self._deferred = (self._deferred, []) if self._deferred else (self.link.wait(None), [])
            for message in messages:
                match message:
                    case Tick():
                        self._tick()
                    case StartLoop():
                        self._start()
                    case BeginAttempt(attempt=attempt):
                        self.attempt = attempt
                        self._armed = False  # until this attempt's loop ticks: its workers are starting
                    case PublishFate():
                        self._commands.put(message)
                    case SendEnd():
                        self._end_sent.add(message.attempt)
                        self._armed = False  # teardown and backoff: the launcher is not in its loop
                        self._commands.put(message)
                    case FinishJob(payload=payload, lost_nodes=lost_nodes):
                        self._post(Reports(self._finish(payload, list(lost_nodes))))
                        return
                    case _:
                        self._meeting(message)
        self._stop.set()  # the launcher is gone

    # ---- before start ----------------------------------------------------------------------------

    def _meeting(self, message: Message) -> None:
        """A meeting message (``_meet``); a failure is the launcher's ``JoinFailed`` (exit 2)."""
        try:
            self._meet(message)
        except AgentError as e:
            self._post(JoinFailed(str(e)))
            return
        except Exception as e:  # the store went away while meeting (the first node stopped)
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            text = f"lost the first node's agent while the nodes met: {first}; started nothing"
            self._post(JoinFailed(text))
            return

    def _meet(self, message: Message) -> None:
        """``Arrive`` or ``Join`` (the elastic loop adds its steps: agents/elastic_agent.py)."""
        match message:
            case Arrive(nnodes=nnodes, token=token, master_port=master_port, rdzv_id=rdzv_id):
                rank, port = arrive(self._open(None), nnodes, token, master_port, rdzv_id)
                self._post(Arrived(rank, port))
            case Join():
                self._join(message)

    def _open(self, host: bool | None) -> AgentStore:
        """The store (once): ``host`` given (node rank 0 hosts), or None (the c10d rule)."""
        if self.store is None:
            if host:  # a client needs no torch; by the c10d rule, torch comes once the port is bound
                import_tcpstore()  # seconds on a busy host: the wait for an answer starts after it
            self._post(Opening())
            self.store = open_store(self.opt.store_addr, self.opt.port, host, self.opt.join_timeout_s)
            self._post(Connected())
        return self.store

    def _join(self, message: Join) -> None:
        self.me, self.name, self.nodes = message.me, message.name, message.nodes
        store = self._open(self.me == 0)
        self.is_host = store.is_host
        admit(store, self.me, self.name, message.token)
        meet(store, self.me, self.name, self.nodes, message.fingerprint, self.opt.join_timeout_s, self._say)
        store.set_timeout(self.opt.keepalive_s)
        self._post(Joined())

    def _start(self) -> None:
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
                host = self.nodes[0]
                text = f"lost the first node {host}'s agent: no answer for {silent:.1f} s (--keepalive-s)"
                self._post_fate(self.attempt, self.lost_fate(host, text))
                self._post(Ended(self.attempt))
                self._post(LoopEnded())
                return

    # ---- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        tick = max(min(0.2, self.opt.keepalive_s / 10), 0.02)
        counted = -1  # the launcher's tick the last beat counted
        watch = KeepAlive(self.me, len(self.nodes), self.opt.keepalive_s, tick)
        posted_end = -1
        try:
            while not self._stop.is_set():
                store = self.store
                assert store is not None
                self._do_commands(store)
                now = time.monotonic()
                beat = watch.due(now)
                if beat and (not self._armed or self._ticks != counted):  # its loop ticked since the last beat
                    counted = self._ticks
                    watch.beat(store)
                attempt = self.attempt
                self._watch_fate(store, attempt)
                if attempt in self._end_sent and posted_end != attempt:
                    outcomes = watch.outcomes(store, attempt)
                    if outcomes is not None:
                        self._watch_fate(store, attempt)  # a fate is always written before its node's end
                        # every node's outcome: one that vetoes a restart (a hang, a signal) stops it everywhere
                        self._post(Ended(attempt, outcomes))
                        posted_end = attempt
                for rank, silent_s in watch.silent(store, now) if beat else []:
                    if store.has([end_key(attempt, rank)]):  # done with this attempt (teardown, backoff)
                        continue
                    self._lost(store, attempt, rank, f"no keep-alive for {silent_s:.1f} s")
                    if rank == WATCHER:  # this node's store loop is on its own
                        self._post(LoopEnded())
                        return
                self._last_ok = time.monotonic()
                self._stop.wait(tick)
        except Exception as e:  # the store (the first node) is unreachable: this node is on its own
            if self._stop.is_set() or self._abandoned:
                return
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            host = self.nodes[0]
            self._post_fate(self.attempt, self.lost_fate(host, f"lost the first node {host}'s agent: {first}"))
            self._post(Ended(self.attempt))
            self._post(LoopEnded())

    def _do_commands(self, store: AgentStore) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            match command:
                case PublishFate(attempt=attempt, fate=fate):
                    self._post_fate(attempt, store.first(f"fate/{attempt}", fate))
                case SendEnd(attempt=attempt, outcome=outcome):
                    store.set(end_key(attempt, self.me), outcome)

    def _watch_fate(self, store: AgentStore, attempt: int) -> None:
        if attempt not in self._posted_fates and store.has([f"fate/{attempt}"]):
            self._post_fate(attempt, store.get(f"fate/{attempt}"))

    def _lost(self, store: AgentStore, attempt: int, rank: int, why: str) -> None:
        """Node ``rank`` is lost: the attempt's fate (unless one came first). The first node, which
        watches every node, also writes the lost node's end (no end will come from it), so that every
        node's end is in once the others are done; a node that finds the first node lost has no end
        to wait for."""
        node = self.nodes[rank]
        text = f"node {node} is lost ({why}, --keepalive-s {self.opt.keepalive_s:g})"
        won = store.first(f"fate/{attempt}", self.lost_fate(node, text))
        self._post_fate(attempt, won)
        if rank != WATCHER:
            store.set(end_key(attempt, rank), "lost")
        elif json.loads(won)["kind"] == "lost":
            self._post(Ended(attempt))

    # ---- after the job ---------------------------------------------------------------------------

    def _finish(self, payload: Mapping[str, Any], lost_nodes: list[str]) -> tuple[dict[str, Any], ...] | None:
        """This node's report to the first node; on the first node, every node's (its own first; a
        node that never sent one is missing)."""
        self._stop.set()
        if self._thread is not None and not self._abandoned:
            self._thread.join(timeout=self.opt.keepalive_s + 1)
        store = self.store
        if store is None or self._abandoned or (self._thread is not None and self._thread.is_alive()):
            return None
        if not self.is_host:
            if self.nodes[0] in lost_nodes:  # nobody to send it to (and a call could hang)
                return None
            try:
                store.set(f"report/{self.me}", json.dumps(payload))
            except Exception as e:
                self._say(f"warning: could not send this node's report to the first node: {e}")
            return None
        got: dict[int, dict[str, Any]] = {0: dict(payload)}
        keys = {r: f"report/{r}" for r in range(1, len(self.nodes)) if self.nodes[r] not in lost_nodes}
        deadline = time.monotonic() + max(10.0, 2 * self.opt.keepalive_s)
        while keys and not store.has(list(keys.values())) and time.monotonic() < deadline:  # one call a poll
            time.sleep(0.05)
        every = bool(keys) and store.has(list(keys.values()))
        sent = list(keys) if every else [r for r, key in keys.items() if store.has([key])]  # at the deadline
        for i in range(0, len(sent), _REPORTS_PER_READ):
            chunk = sent[i : i + _REPORTS_PER_READ]
            for r, text in zip(chunk, store.get_many([keys[r] for r in chunk]), strict=True):
                got[r] = json.loads(text)
        return tuple(got[r] for r in sorted(got))
