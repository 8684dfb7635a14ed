"""The launcher's end of the agent's store helper (agents/store_loop.py's ``StoreLoop``, forked while
the launcher has one thread): every call but ``join`` and ``finish`` is non-blocking, and what the
helper saw comes back as agents/store_messages.py's messages."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from openclaw_launch.agents.meeting import WAIT_NOTE_S, launcher_token
from openclaw_launch.agents.store import AgentError
from openclaw_launch.agents.store_loop import LoopOptions, LostFate, StoreLoop
from openclaw_launch.agents.store_messages import (
    VOCABULARY,
    Arrive,
    Arrived,
    BeginAttempt,
    Connected,
    FinishJob,
    Join,
    Joined,
    JoinFailed,
    Opening,
    PublishFate,
    Reports,
    Say,
    SendEnd,
    StartLoop,
    Tick,
)
from openclaw_launch.run.helper import Helper, Link, Message

_JOIN_POLL_S = 0.1  # how often a waiting join looks for a signal
TICK_S = 0.25  # a waiting step tells the helper this often that the launcher's loop runs (at most)
_FINISH_MARGIN_S = 5.0
Answer = TypeVar("Answer", bound=Message)


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
            StoreLoop(link, options, lost_fate).serve()

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
        self,
        nnodes: int,
        master_port: int,
        say: Callable[[str], None],
        interrupted: Callable[[], int | None],
        rdzv_id: str = "none",
    ) -> tuple[int, int] | int:
        """Node ranks by arrival: (this node's rank, the workers' MASTER_PORT), or the number of
        the signal that stopped the wait; ``AgentError`` if refused. ``master_port``: this host's
        free port, the job's if this launcher hosts the store (node rank 0)."""
        answer = self._exchange(Arrive(nnodes, self.token, master_port, rdzv_id), Arrived, say, interrupted)
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
        ticking: bool = False,
    ) -> Answer | int:
        """Send ``request`` and wait for its ``answer`` (or a signal's number); ``ticking``: with a
        ``Tick`` every ``TICK_S`` (a waiting member's beat, agents/elastic.py). Until the store answers,
        say so every ``WAIT_NOTE_S``; a store that has not answered within ``--agent-timeout-s``
        (nothing there, or a port that accepts connections but speaks no store protocol, where
        the store client would wait without end) is an error, and the helper is ended."""
        link, opt = self._helper.link, self._opt
        link.send(request)
        start: float | None = None  # when the helper began to open the store (torch is imported then)
        noted = ticked = 0.0
        while True:
            if ticking and time.monotonic() - ticked >= TICK_S:
                ticked = time.monotonic()
                link.send(Tick())
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

    def tick(self) -> None:
        """The launcher's loop ran (its keep-alive: agents/store_loop.py bumps it only then)."""
        self._helper.link.send(Tick())

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
