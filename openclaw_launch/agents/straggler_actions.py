"""The straggler policy carried out (``--on-straggler exclude``, agents/straggler_policy.py decides):
the elastic agent's part (agents/elastic_agent.py) on every node of the world.

1. Node 0 (it judges the job-wide live verdict): ``observe`` hands each interval's verdict to the
   policy; an ``Exclude`` becomes an ``exclude`` fate (``fate_of``) that the first node's rendezvous
   checks (MIN with the standbys, a restart left: agents/elastic.py ``Rendezvous.exclude``) and
   publishes, or refuses (``refused``: one line, the count starts again).
2. Every node, at the ``exclude`` fate: the checkpoint request (the fate's signal, ``--checkpoint-signal``)
   to its workers once, then after the fate's grace (``--straggler-grace-s``) a restartable stop
   (``grace_over``); the world re-forms without the node (the agent's ``take_out``), a standby in its
   place where there is one.
3. Node 0, in the re-formed world: the first judged interval verifies the exclusion (``Verified``: the
   verdict must not name the replacement); its step time completes the report's record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from openclaw_launch import exit_codes
from openclaw_launch.agents.elastic import EXCLUDE
from openclaw_launch.agents.fate import AgentOptions, Fate
from openclaw_launch.agents.straggler_policy import (
    Action,
    Exclude,
    Note,
    StragglerSettings,
    StragglerWatch,
    Verified,
)
from openclaw_launch.config.signals import signal_numbers
from openclaw_launch.report.membership import STRAGGLER, Exclusion
from openclaw_launch.run.failure_class import Evidence
from openclaw_launch.run.helper import Message
from openclaw_launch.run.participant import StopKind, StopReason
from openclaw_launch.stats.judged import Judged

_PREFIX = "openclaw-launch: straggler policy: "


@dataclass(frozen=True)
class ExcludeNode(Message):
    """Launcher -> its agent helper (the first node): stop the world to take ``node_rank`` out."""

    node_rank: int
    fate: str  # the ``exclude`` fate's JSON (``fate_of``)


@dataclass(frozen=True)
class ExcludeRefused(Message):
    """Helper -> launcher: the rendezvous did not take the node out (``text``: why)."""

    text: str


class _Link(Protocol):
    def ask_exclude(self, node_rank: int, fate: str) -> None: ...


class ExcludingAgent(Protocol):
    """What of the elastic agent (agents/elastic_agent.py) the actions use."""

    is_host: bool
    opt: AgentOptions
    exclusions: list[Exclusion]

    @property
    def elastic_link(self) -> _Link: ...

    def take_out(self, node_rank: int, reason: str, evidence: str, step_time_before_s: float | None = None) -> None: ...


class StragglerActions:
    """One node's side of the policy, for the whole job (its worker pids per attempt)."""

    def __init__(
        self,
        settings: StragglerSettings,
        say: Callable[[str], None],
        kill: Callable[[int, int], None] = os.killpg,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.watch = StragglerWatch(settings)
        self._say, self._kill, self._clock = say, kill, clock
        self._pids: list[int] = []  # this attempt's workers (their process groups)
        self._grace_ends_at: float | None = None  # this attempt's checkpoint request: its grace's end
        self.pending: Exclude | None = None  # node 0: asked of the rendezvous, its fate not seen yet
        self.accepted: Exclude | None = None  # node 0: its fate came: the next world verifies it
        self._nodes_before = 0  # node 0: the world's size when it was taken out
        self.info = False  # node 0, LOGLEVEL INFO (job/info_log.py): one line per judged interval

    # ---- every node -----------------------------------------------------------------------------

    def begin_attempt(self) -> None:
        self._pids, self._grace_ends_at = [], None

    def on_spawn(self, pid: int) -> None:
        self._pids.append(pid)

    def stop_reason(self, fate: Fate) -> StopReason | None:
        """At an ``exclude`` fate: the checkpoint request to this node's workers (once), then, once the
        fate's grace has passed, a restartable stop (no failure: the class ``exclude``)."""
        if not self._grace_over(fate):
            return None
        evidence = Evidence(stop=EXCLUDE)  # run/failure_class.py
        return StopReason(StopKind.REMOTE, fate.code, fate.text, True, fate.node, fate.rank, evidence)

    def stop_due_in_s(self) -> float | None:
        """After the checkpoint request: the seconds left of the grace (the supervisor's loop wakes
        then to stop the workers, not at the agent's next tick)."""
        return None if self._grace_ends_at is None else max(0.0, self._grace_ends_at - self._clock())

    def fate_came(self, fate: Fate, agent: ExcludingAgent) -> None:
        """An ``exclude`` fate, said on every node; node 0 takes the node out at the re-forming (the
        agent's ``take_out``) if it is the one it asked for."""
        self._say(f"openclaw-launch: {fate.text}")
        if agent.is_host and (exclude := self._fate_seen(fate, len(agent.opt.nodes))) is not None:
            agent.take_out(exclude.node_rank, STRAGGLER, exclude.why, exclude.step_before_s)

    def _grace_over(self, fate: Fate) -> bool:
        """The checkpoint request (once), then True once the fate's grace has passed since."""
        now = self._clock()
        if self._grace_ends_at is None:
            self._grace_ends_at = now + fate.grace_s
            name = signal.Signals(fate.signal).name if fate.signal else "no signal"
            for pid in self._pids if fate.signal else ():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    self._kill(pid, fate.signal)
            self._say(
                f"openclaw-launch: checkpoint request: {name} to this node's {len(self._pids)} worker(s); they stop "
                f"in {fate.grace_s:g} s (--straggler-grace-s), then the world re-forms without node {fate.node}"
            )
        return now >= self._grace_ends_at

    # ---- node 0 ---------------------------------------------------------------------------------

    def observe(self, judged: Judged, agent: ExcludingAgent) -> Action | None:
        """An interval's verdict: the policy's action, its line said. An ``Exclude`` is asked of the
        rendezvous (``pending`` until its fate comes or a refusal); a ``Verified`` completes the
        exclusion's record (its step time after, and the next world's verdict in its evidence)."""
        nodes = agent.opt.nodes
        waiting = self.accepted or self.pending
        if waiting is not None and judged.attempt <= waiting.attempt:
            self._interval(judged, "not counted: the world stops", counted=False)
            return None  # the world stops (or the rendezvous has not answered): its last lines do not count
        accepted = self.accepted
        if accepted is not None:  # the world after the exclusion
            self.accepted = None
            kept = len(nodes) == self._nodes_before  # a standby took its rank; else the ranks closed up
            self.watch.excluded(accepted, nodes[accepted.node_rank] if kept else "")
        action = self.watch.observe(judged)
        row = self.settings.intervals if isinstance(action, Exclude) else self.watch.in_a_row
        self._interval(judged, f"{row} of {self.settings.intervals} in a row")
        match action:
            case Note(text=text):
                self._say(_PREFIX + text)
            case Exclude():
                self.pending = action
                self._say(f"{_PREFIX}taking node {action.node} (node rank {action.node_rank}) out: {action.why}")
                agent.elastic_link.ask_exclude(action.node_rank, self.fate_of(action).to_json())
            case Verified(named=named, text=text):
                self._say(_PREFIX + ("warning: " if named else "") + text)
                after = f"; the next world: {action.verdict}" + (", the replacement" if named else "")
                agent.exclusions = [
                    replace(x, step_time_after_s=action.step_after_s, evidence=x.evidence + after)
                    if x.reason == STRAGGLER and x.world == action.excluded.attempt
                    else x
                    for x in agent.exclusions
                ]
        return action

    def _interval(self, judged: Judged, count: str, counted: bool = True) -> None:
        """LOGLEVEL INFO: node 0's judgement of one interval, in one line (``counted``: the policy's
        interval number, else none: the stopping world's last intervals are not the policy's)."""
        if not self.info:
            return
        which = f"interval {self.watch.intervals_seen}" if counted else "interval"
        step = f"step p50 {1000 * judged.step_p50_s:.1f} ms" if judged.step_p50_s is not None else "no step yet"
        if not judged.judged:
            verdict = "too few steps to judge"
        else:
            verdict = f"straggler: {judged.named}" if judged.node else "no straggler"
        self._say(
            f"openclaw-launch: info: straggler policy: world {judged.attempt} {which}: {verdict}, {step}; {count}"
        )

    def fate_of(self, exclude: Exclude) -> Fate:
        """The ``exclude`` fate every node acts on: node 0's grace and checkpoint signal go with it."""
        sig = signal_numbers((self.settings.checkpoint_signal,))[0]
        text = (
            f"node {exclude.node} is the job's straggler ({exclude.why}): it is taken out "
            f"(--on-straggler exclude); every worker gets {self.settings.checkpoint_signal} to checkpoint"
        )
        return Fate(EXCLUDE, exclude.node, None, exit_codes.NODE_LOST, text, self.settings.grace_s, sig)

    def refused(self, text: str) -> None:
        """The rendezvous did not take the pending node out: said, and the count starts again."""
        if self.pending is not None:
            self._say(f"{_PREFIX}node {self.pending.node} stays: {text}")
        self.pending = None
        self.watch.refused()

    def _fate_seen(self, fate: Fate, nodes: int) -> Exclude | None:
        """Node 0: the ``exclude`` fate it asked for came back, in a world of ``nodes``: the exclusion to
        take out, else None."""
        exclude, self.pending = self.pending, None
        if exclude is None or exclude.node != fate.node:
            return None
        self.accepted, self._nodes_before = exclude, nodes
        return exclude
