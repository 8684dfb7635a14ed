"""The node agent: meet before start, one fate while running, restart in lockstep, report once.

Keys in the store (``store.PREFIX`` + ...), ``r`` a node rank, ``a`` an attempt:

- ``hb/r``      keep-alive counter, bumped (``add``) by node r's store loop when its launcher ticked;
                node rank 0 watches every node's, every other node only node 0's (agents/keepalive.py)
- ``fp/r``      node r's fingerprint (JSON), compared by node rank 0 (``verdict``: agents/meeting.py)
- ``fate/a``    the first stop of attempt a anywhere (first writer wins: compare-and-set):
                ``{"kind": "failure"|"signal"|"hang"|"lost", "node", "rank", "code", "text"}``
- ``end/a/r``   node r's workers of attempt a are gone, with its own outcome: ``ok``, ``stopped``
                (by the fate), or the kind of its own first reason that vetoes a restart
                (``signal``/``hang``), else of its first (``failure``); ``lost``: node 0 found it lost
- ``outcomes/a`` the distinct outcomes of every node's end, published by node rank 0 once all are in
- ``report/r``  node r's report and statistics, for the first node's job report

The store traffic runs in a helper process (agents/store_loop.py: the launcher forks with one
thread, and torch's TCPStore is imported there only); it talks to the supervisor's event loop
through a socket (``readers``), so a slow or cut network never blocks the loop. The agent is a
supervision ``Participant`` (run/participant.py): told this node's stop reasons (``on_stop``), it
publishes the first as the fate; another node's fate is its ``stop_reason``; it holds each attempt
until every node is done with it; its ``vote_restart`` is the job's decision.

Restarts are decided once, the same on every node: after attempt a every node waits until each
node's ``end/a/r`` is there (``outcomes/a``; or the first node is lost); the job restarts iff this
node wishes it, ``fate/a`` is a worker failure, and no node's outcome vetoes it (a signal or a hang
anywhere, even one that came second). Then every node restarts (same backoff), or none does. A
hang is the job's fate like a failure: every node stops and exits 124.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_launch import exit_codes
from openclaw_launch.agents.store_link import StoreLink
from openclaw_launch.agents.store_messages import Ended, FateOf, LoopEnded, Say
from openclaw_launch.config import defaults
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.run.helper import Message
from openclaw_launch.run.participant import Participant, StopKind, StopReason, Timer

_TICK_S = 0.25  # the launcher's keep-alive tick (at most; an eighth of --keepalive-s when that is shorter)
EXIT_NODE_LOST = exit_codes.NODE_LOST  # the job's exit code on the surviving nodes when a node was lost


@dataclass(frozen=True)
class AgentOptions:
    store_addr: str  # where the first node's agent listens (its config ip, or MASTER_ADDR)
    port: int
    nodes: tuple[str, ...]  # config order: node rank -> name
    join_timeout_s: float = defaults.AGENT_TIMEOUT_S
    keepalive_s: float = defaults.KEEPALIVE_S
    max_restarts: int = 0


@dataclass(frozen=True)
class Arrival:
    """This node's rank by arrival, and the helper that took it (the agent's, from then on)."""

    node_rank: int
    master_port: int  # the workers' MASTER_PORT: node rank 0's free port
    link: StoreLink
    options: AgentOptions  # where the agents met (nodes and restarts: the plan's, given later)


def arrive(
    options: AgentOptions,
    nnodes: int,
    free_port: int,
    say: Callable[[str], None],
    interrupted: Callable[[], int | None],
    rdzv_id: str = "none",
) -> Arrival | int:
    """Node ranks by arrival (c10d without ``--node-rank``), before the plan is built: the agent's
    helper is forked here and opens the store by the c10d rule (agents/store.py); the store's host
    is node rank 0 and its ``free_port`` the workers' MASTER_PORT. Returns a signal's number if
    one stopped the wait; ``AgentError`` if refused (a launcher too many) or nothing answered."""
    link = StoreLink.start(options, lost_fate)
    try:
        answer = link.arrive(nnodes, free_port, say, interrupted, rdzv_id)
    except BaseException:
        link.close()
        raise
    if isinstance(answer, int):
        link.close()
        return answer
    return Arrival(node_rank=answer[0], master_port=answer[1], link=link, options=options)


@dataclass(frozen=True)
class Fate:
    kind: str  # failure | signal | hang | lost (StopKind's values)
    node: str
    rank: int | None
    code: int
    text: str  # what every node prints
    grace_s: float = 0.0  # exclude (agents/straggler_actions.py): from the checkpoint request to the stop
    signal: int = 0  # exclude: the checkpoint request every node sends its workers (0: none)

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
    def __init__(
        self, plan: LaunchPlan, options: AgentOptions, say: Callable[[str], None], link: StoreLink | None = None
    ) -> None:
        """``link``: the helper that took this node's rank by arrival (agents/arrival.py), else
        ``join`` forks one."""
        self.plan, self.opt, self.say = plan, options, say
        self.me = plan.node_rank
        self.name = plan.node
        self.is_host = self.me == 0
        self._link = link  # the store loop's helper process, from ``join`` on
        self._loop_alive = False  # the helper's store loop runs (it stops when a node is lost)
        self.attempt = 0
        self.fates: dict[int, Fate] = {}  # the job's fate per attempt, as this node knows it
        self.ended: set[int] = set()  # attempts every node is done with
        self._end_sent: set[int] = set()
        self._local: dict[int, str] = {}  # this node's outcome per attempt
        self.outcomes: dict[int, tuple[str, ...]] = {}  # every node's end outcome per attempt, once all are in
        self.lost_nodes: set[str] = set()

    # ---- before start -----------------------------------------------------------------------------

    def join(self, fingerprint: Mapping[str, str], interrupted: Callable[[], int | None]) -> int | None:
        """Claim this node's rank (a second launcher for it is refused), meet every node and
        compare fingerprints (in the store loop's helper, forked here while the launcher has one
        thread). Returns a signal number if one stopped
        the wait (nothing started), None when all agree; raises ``AgentError`` otherwise."""
        if self._link is None:
            self._link = StoreLink.start(self.opt, lost_fate)
        return self._link.join(self.me, self.name, self.opt.nodes, fingerprint, self.say, interrupted)

    def start(self) -> None:
        assert self._link is not None
        self._link.start_loop()
        self._loop_alive = True

    # ---- supervisor hooks (main thread) ----------------------------------------------------------

    def fileno(self) -> int:
        assert self._link is not None
        return self._link.fileno()

    def drain(self) -> None:
        assert self._link is not None
        self._take(self._link.events())

    def _take(self, events: list[Message]) -> None:
        """The store loop's news, in the order it saw it."""
        for event in events:
            match event:
                case FateOf(attempt=attempt, fate=fate):
                    self._on_fate(attempt, Fate.from_json(fate))
                case Ended(attempt=attempt, outcomes=outcomes):
                    self.ended.add(attempt)
                    self.outcomes[attempt] = outcomes  # none when a node is lost
                case LoopEnded():
                    self._loop_alive = False
                case Say(text=text):
                    self.say(f"openclaw-launch: {text}")
        if self._link is not None and self._link.closed and self._loop_alive:  # the helper died
            self._loop_alive = False
            host = self.opt.nodes[0]
            text = f"lost the first node {host}'s agent: this node's store loop (pid {self._link.pid}) ended"
            self._on_fate(self.attempt, Fate("lost", host, None, EXIT_NODE_LOST, text))
            self.ended.add(self.attempt)

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

    def timers(self) -> Sequence[Timer]:
        """The launcher's loop tells the helper it runs: the keep-alive counts these ticks
        (agents/store_loop.py), so a frozen launcher is lost, not only a dead helper."""
        return ((min(_TICK_S, self.opt.keepalive_s / 8), self._tick),)

    def _tick(self) -> None:
        if self._link is not None:
            self._link.tick()

    def begin_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        if self._link is not None:
            self._link.set_attempt(attempt)

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
        if outcome is None and attempt not in self.fates and self._link is not None:
            fate = Fate(reason.kind.value, self.name, reason.rank, reason.exit_code, f"node {self.name}: {reason.text}")
            self._link.publish_fate(attempt, fate.to_json())

    def holds_attempt(self) -> bool:
        """True while another node is still running this attempt."""
        attempt = self.attempt
        if attempt not in self._end_sent:
            self._end_sent.add(attempt)
            outcome = self._local.get(attempt) or ("stopped" if attempt in self.fates else "ok")
            if self._link is not None:
                self._link.send_end(attempt, outcome)
        return attempt not in self.ended and self._loop_alive

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        """The job's decision, alike on every node: this node's wish, the fate a failure, and no
        node's outcome a veto (outcomes unknown, e.g. a node lost: the fate says lost anyway)."""
        fate = self.fates.get(attempt)
        vetoed = any(o not in _RESTARTABLE_OUTCOMES for o in self.outcomes.get(attempt, ()))
        return wish and fate is not None and fate.restartable and not vetoed

    # ---- after the job (main thread) -------------------------------------------------------------

    def finish(self, payload: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
        """Hand this node's report to the first node. On the first node: every node's payloads
        (its own first; a node that never sent one is missing), else None. The helper stops its
        loop first, and answers within the keep-alive and the report wait."""
        if self._link is None:
            return None
        events, reports = self._link.finish(payload, sorted(self.lost_nodes))
        self._take(events)
        return reports

    def close(self) -> None:
        if self._link is not None:
            self._link.close()


def lost_fate(node: str, text: str) -> str:
    """The store loop's fate for a lost node (or an unreachable first node)."""
    return Fate("lost", node, None, EXIT_NODE_LOST, text).to_json()
