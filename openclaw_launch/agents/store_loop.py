"""The node agent's store traffic, in a helper process (run/helper.py): the launcher forks with one
thread, so the TCPStore client, its keep-alive loop and the watchdog run there, and torch (the
TCPStore) is imported there, never in the launcher.

The agent (agents/fate.py) forks the helper before the nodes meet and keeps the decisions; the
helper does the store calls and reports what it sees. Its messages are agents/store_messages.py's.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from openclaw_launch.agents.meeting import WAIT_NOTE_S, admit, arrive, launcher_token, meet
from openclaw_launch.agents.store import AgentError, AgentStore, import_tcpstore, open_store
from openclaw_launch.agents.store_messages import (
    VOCABULARY,
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
)
from openclaw_launch.run.helper import Helper, Link, Message

_JOIN_POLL_S = 0.1  # how often a waiting join looks for a signal
_FINISH_MARGIN_S = 5.0

Answer = TypeVar("Answer", bound=Message)


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


class StoreLink:
    """The launcher's side of the helper; every call but ``join`` and ``finish`` is non-blocking."""

    def __init__(self, helper: Helper, options: LoopOptions) -> None:
        self._helper = helper
        self._opt = options
        self.token = launcher_token()  # this launcher, as the holder of its node rank
        self._connected = False

    @classmethod
    def start(cls, options: LoopOptions, lost_fate: LostFate) -> StoreLink:
        """Fork the helper (while the launcher has one thread)."""

        def main(link: Link) -> None:
            _Loop(link, options, lost_fate).serve()

        return cls(Helper.fork("openclaw-agent", main, VOCABULARY), options)

    @property
    def pid(self) -> int:
        return self._helper.pid

    @property
    def closed(self) -> bool:
        """The helper is gone (or was ended)."""
        return self._helper.link.closed

    def fileno(self) -> int:
        return self._helper.fileno()

    def arrive(
        self, nnodes: int, master_port: int, say: Callable[[str], None], interrupted: Callable[[], int | None]
    ) -> tuple[int, int] | int:
        """Node ranks by arrival: (this node's rank, the workers' MASTER_PORT), or the number of
        the signal that stopped the wait; ``AgentError`` if refused. ``master_port``: this host's
        free port, the job's if this launcher hosts the store (node rank 0)."""
        answer = self._exchange(Arrive(nnodes, self.token, master_port), Arrived, say, interrupted)
        return answer if isinstance(answer, int) else (answer.rank, answer.master_port)

    def join(
        self,
        me: int,
        name: str,
        nodes: tuple[str, ...],
        fingerprint: Mapping[str, str],
        say: Callable[[str], None],
        interrupted: Callable[[], int | None],
    ) -> int | None:
        """Claim node rank ``me`` (``nodes``: every node's name), meet every node and compare
        fingerprints, in the helper. Returns a signal number if one stopped the wait, None when all agree; raises
        ``AgentError`` otherwise."""
        request = Join(me, name, tuple(nodes), self.token, dict(fingerprint))
        answer = self._exchange(request, Joined, say, interrupted)
        return answer if isinstance(answer, int) else None

    def _exchange(
        self,
        request: Message,
        answer: type[Answer],
        say: Callable[[str], None],
        interrupted: Callable[[], int | None],
    ) -> Answer | int:
        """Send ``request`` and wait for its ``answer`` (or a signal's number). Until the store answers,
        say so every ``WAIT_NOTE_S``; a store that has not answered within ``--agent-timeout-s``
        (nothing there, or a port that accepts connections but speaks no store protocol, where
        the store client would wait without end) is an error, and the helper is ended."""
        link, opt = self._helper.link, self._opt
        link.send(request)
        start: float | None = None  # when the helper began to open the store (torch is imported then)
        noted = 0.0
        while True:
            link.flush(_JOIN_POLL_S)
            for message in link.wait(_JOIN_POLL_S):
                if isinstance(message, answer):
                    return message
                match message:
                    case Opening():
                        start = noted = time.monotonic()
                    case Connected():
                        self._connected = True
                    case Say(text=text):
                        say(f"openclaw-launch: {text}")
                    case JoinFailed(text=text):
                        raise AgentError(text)
            if link.closed:
                raise AgentError(f"this node's store loop (pid {self.pid}) ended while the nodes met; started nothing")
            sig = interrupted()
            if sig is not None:
                return sig
            now, where = time.monotonic(), f"{opt.store_addr}:{opt.port}"
            if start is None or self._connected:
                continue
            if now - start >= opt.join_timeout_s:
                self._helper.end(0)
                raise AgentError(
                    f"no agent answered at {where} within {opt.join_timeout_s:g} s (--agent-timeout-s): nothing "
                    "listens there, or what does is not an openclaw-launch agent (it accepts connections but "
                    "does not speak the agents' store protocol); check the port; started nothing"
                )
            if now - noted >= WAIT_NOTE_S:
                noted = now
                say(
                    f"openclaw-launch: waiting for the first node's agent at {where}: "
                    f"{opt.join_timeout_s - (now - start):.0f} s left (--agent-timeout-s)"
                )

    def start_loop(self) -> None:
        self._helper.link.send(StartLoop())

    def set_attempt(self, attempt: int) -> None:
        self._helper.link.send(BeginAttempt(attempt))

    def publish_fate(self, attempt: int, fate: str) -> None:
        self._helper.link.send(PublishFate(attempt, fate))

    def send_end(self, attempt: int, outcome: str) -> None:
        self._helper.link.send(SendEnd(attempt, outcome))

    def events(self) -> list[Message]:
        return self._helper.link.receive()

    def finish(
        self, payload: Mapping[str, Any], lost_nodes: list[str]
    ) -> tuple[list[Message], list[Mapping[str, Any]] | None]:
        """Stop the loop and exchange the reports (bounded by the keep-alive and the report wait).
        Returns the events that came before the answer, and the answer (None: no reports)."""
        link = self._helper.link
        link.send(FinishJob(dict(payload), tuple(lost_nodes)))
        keepalive_s = self._opt.keepalive_s
        deadline = time.monotonic() + keepalive_s + 1 + max(10.0, 2 * keepalive_s) + _FINISH_MARGIN_S
        before: list[Message] = []
        while not link.closed and (left := deadline - time.monotonic()) > 0:
            link.flush(left)
            for message in link.wait(left):
                if isinstance(message, Reports):
                    return before, list(message.reports) if message.reports is not None else None
                before.append(message)
        return before, None

    def close(self) -> None:
        self._helper.end()


class _Loop:
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

    def _post(self, message: Message) -> None:
        self.link.send(message)

    def _say(self, text: str) -> None:
        self._post(Say(text))

    def _post_fate(self, attempt: int, fate: str) -> None:
        if attempt not in self._posted_fates:
            self._posted_fates.add(attempt)
            self._post(FateOf(attempt, fate))

    def serve(self) -> None:
        while not self.link.closed:
            for message in self.link.wait(None):
                match message:
                    case StartLoop():
                        self._start()
                    case BeginAttempt(attempt=attempt):
                        self.attempt = attempt
                    case PublishFate():
                        self._commands.put(message)
                    case SendEnd():
                        self._end_sent.add(message.attempt)
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
            case Arrive(nnodes=nnodes, token=token, master_port=master_port):
                rank, port = arrive(self._open(None), nnodes, token, master_port)
                self._post(Arrived(rank, port))
            case Join():
                self._join(message)

    def _open(self, host: bool | None) -> AgentStore:
        """The store (once): ``host`` given (node rank 0 hosts), or None (the c10d rule)."""
        if self.store is None:
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
        beats = 0
        peers = [r for r in range(len(self.nodes)) if r != self.me]
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
                ends = [f"end/{attempt}/{r}" for r in range(len(self.nodes))]
                if store.has(ends) and attempt in self._end_sent and posted_end != attempt:
                    self._watch_fate(store, attempt)  # a fate is always written before its node's end
                    # every node's outcome: one that vetoes a restart (a hang, a signal) stops it everywhere
                    self._post(Ended(attempt, tuple(store.get_many(ends))))
                    posted_end = attempt
                now = time.monotonic()
                for r, beat in zip(peers, store.get_many([f"hb/{r}" for r in peers]), strict=True):
                    seen = last_seen.get(r)
                    if seen is None or seen[0] != beat:
                        last_seen[r] = (beat, now)
                    elif now - seen[1] > self.opt.keepalive_s and not store.has([f"end/{attempt}/{r}"]):
                        self._lost(store, attempt, self.nodes[r], f"no keep-alive for {now - seen[1]:.1f} s")
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
                    store.set(f"end/{attempt}/{self.me}", outcome)

    def _watch_fate(self, store: AgentStore, attempt: int) -> None:
        if attempt not in self._posted_fates and store.has([f"fate/{attempt}"]):
            self._post_fate(attempt, store.get(f"fate/{attempt}"))

    def _lost(self, store: AgentStore, attempt: int, node: str, why: str) -> None:
        text = f"node {node} is lost ({why}, --keepalive-s {self.opt.keepalive_s:g})"
        won = store.first(f"fate/{attempt}", self.lost_fate(node, text))
        self._post_fate(attempt, won)
        if json.loads(won)["kind"] == "lost":  # no end will come from a lost node
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
        wanted = [r for r in range(1, len(self.nodes)) if self.nodes[r] not in lost_nodes]
        deadline = time.monotonic() + max(10.0, 2 * self.opt.keepalive_s)
        while wanted and time.monotonic() < deadline:
            for r in [r for r in wanted if store.has([f"report/{r}"])]:
                got[r] = json.loads(store.get(f"report/{r}"))
                wanted.remove(r)
            time.sleep(0.05)
        return tuple(got[r] for r in sorted(got))
