"""The node agent of an elastic job (``--nnodes MIN:MAX``): agents/fate.py's agent, one world at a
time. Each attempt is one world (its number is the job's attempt, TORCHELASTIC_RESTART_COUNT); after
a restartable end (a worker failure, a lost node, a node that arrived) every node of the world asks
the rendezvous (agents/elastic.py) for the next world, builds its plan for it (``replan``: the pure
plan for node rank k of n), meets the new world's nodes and starts its workers again.

Its steps go to its agent helper over agents/elastic_link.py's link (the membership's messages and
the helper's loop with the rendezvous); the straggler policy's part is agents/straggler_actions.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openclaw_launch.agents.elastic import EXCLUDE, REFORM
from openclaw_launch.agents.elastic_link import (
    ElasticLink,
    JobDone,
    Reform,
    StepTaken,
    World,
    WorldAnswer,
    WorldRunning,
)
from openclaw_launch.agents.exclusions import ExclusionLog, Fault, Leave
from openclaw_launch.agents.fate import EXIT_NODE_LOST, Agent, AgentOptions, Fate
from openclaw_launch.agents.store import AgentError
from openclaw_launch.agents.store_link import Answer
from openclaw_launch.agents.straggler_actions import ExcludeRefused, StragglerActions
from openclaw_launch.agents.straggler_policy import StragglerSettings
from openclaw_launch.config.defaults import GPU_MEMORY_TIMEOUT_S
from openclaw_launch.exit_codes import TAKEN_OUT
from openclaw_launch.plan.model import LaunchPlan, RankPlan
from openclaw_launch.report.membership import Exclusion
from openclaw_launch.run.failure_class import Evidence
from openclaw_launch.run.helper import Message
from openclaw_launch.run.participant import StopKind, StopReason, Timer
from openclaw_launch.stats.judged import Judged

# Kinds of an attempt's fate after which an elastic job re-forms (restarts left): REFORM is the
# rendezvous's own, a node that arrived while the world ran; EXCLUDE the straggler policy's.
_REFORMING_FATES = frozenset({StopKind.FAILURE.value, StopKind.LOST.value, REFORM, EXCLUDE})
# A node's end outcome that does not stop the job from re-forming ("lost": the rendezvous ended a lost node's).
_REFORMING_OUTCOMES = frozenset({"ok", "stopped", StopKind.FAILURE.value, StopKind.LOST.value})
_NO_WORLD_TICK_S = 0.05  # an attempt without a world: how soon its stop reason is asked


Replan = Callable[["World"], tuple[LaunchPlan, tuple[str, ...], dict[str, str]]]  # -> plan, node names, fingerprint


class ElasticAgent(Agent):
    """agents/fate.py's agent, re-formed after every restartable attempt."""

    def __init__(
        self,
        plan: LaunchPlan,
        options: AgentOptions,
        say: Callable[[str], None],
        link: ElasticLink,
        world: World,
        replan: Replan,
        straggler: StragglerSettings | None = None,
    ) -> None:
        """``straggler``: the straggler policy (``--on-straggler``) this agent carries out."""
        super().__init__(plan, options, say, link)
        self.straggler = StragglerActions(straggler or StragglerSettings(), say)
        self.elastic_link, self.world, self.replan = link, world, replan
        # the nodes taken out (agents/exclusions.py): its path and count, and this node's own fault per
        # attempt, are set by job/node_health.py
        self.exclusion_log = ExclusionLog(None, say)
        self.node_fault: Callable[[int], Fault | None] = _no_fault
        self.gpu_memory_timeout_s = GPU_MEMORY_TIMEOUT_S
        self._leave: list[Leave] = []  # the first node: nodes its launcher takes out at the next re-forming
        self.first_round = world.round  # a node taken in later starts at the job's attempt then
        self.memberships: dict[int, World] = {}  # the job's attempt -> this node's world in it
        self.world_sizes: dict[int, int] = {}  # world -> its WORLD_SIZE
        self._no_world: StopReason | None = None  # this attempt found no next world: it ends the job
        self._no_world_told = False

    def start(self) -> None:
        super().start()
        self._step(WorldRunning(), StepTaken)

    def begin_attempt(self, attempt: int) -> None:
        """Attempt 0 runs the first world; every later one (the job restarts) re-forms first."""
        self._no_world = None
        self.straggler.begin_attempt()
        if attempt > 0:  # before the helper hears of the attempt: the last world's loop ends first
            self._reform(self.fates.get(self.first_round + attempt - 1), self.node_fault(attempt - 1))
        super().begin_attempt(self.first_round + attempt)
        self.memberships[self.attempt] = self.world
        self.world_sizes[self.world.round] = self.plan.world_size

    def attempt_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> tuple[RankPlan, ...]:
        """This world's plan, with the job's restart count; none when no world formed."""
        return () if self._no_world is not None else self.plan.attempt_ranks(self.first_round + attempt)

    def stop_reason(self) -> StopReason | None:
        """A lost node or an arrival stops every node of the world, the first node too (restartable);
        no next world ends the job as a lost node."""
        if self._no_world is not None:
            self._no_world_told = True
            return self._no_world
        fate = self.fates.get(self.attempt)
        if fate is not None and fate.kind == EXCLUDE:  # the checkpoint request, then after the grace a stop
            return self.straggler.stop_reason(fate)
        if fate is not None and fate.kind in (StopKind.LOST.value, REFORM):
            if fate.kind == StopKind.LOST.value:
                return StopReason(StopKind.LOST, fate.code, fate.text, True, fate.node, fate.rank)
            grown = Evidence(stop=REFORM)  # a node arrived: no failure, its own class (run/failure_class.py)
            return StopReason(StopKind.REMOTE, fate.code, fate.text, True, fate.node, fate.rank, grown)
        return super().stop_reason()

    def stop_due_in_s(self) -> float | None:
        """An ``exclude`` fate's grace: its end wakes the supervisor's loop (``stop_reason`` stops then)."""
        fate = self.fates.get(self.attempt)
        return self.straggler.stop_due_in_s() if fate is not None and fate.kind == EXCLUDE else None

    def on_spawn(self, rank: int, pid: int) -> None:
        self.straggler.on_spawn(pid)  # the checkpoint request's addressees

    @property
    def watches_stragglers(self) -> bool:
        """Node 0 of a job that excludes stragglers: it acts on the job-wide live verdict (``observe``)."""
        return self.is_host and self.straggler.settings.excludes

    def observe(self, judged: Judged) -> None:
        """Node 0: an interval's job-wide verdict (stats/job_live.py) for the straggler policy."""
        self.straggler.observe(judged, self)

    def _take(self, events: list[Message]) -> None:
        for event in events:
            if isinstance(event, ExcludeRefused):
                self.straggler.refused(event.text)
        super()._take([e for e in events if not isinstance(e, ExcludeRefused)])

    def _on_fate(self, attempt: int, fate: Fate) -> None:
        """An ``exclude`` fate: said on every node (its workers stop after the grace, ``stop_reason``);
        the first node takes the node out at the re-forming."""
        if fate.kind != EXCLUDE or attempt in self.fates:
            super()._on_fate(attempt, fate)
            return
        self.fates[attempt] = fate
        self.straggler.fate_came(fate, self)

    def timers(self) -> Sequence[Timer]:
        """With no next world the attempt starts no worker: a tick, so that its stop reason is asked;
        else the keep-alive's tick (agents/fate.py)."""
        return ((_NO_WORLD_TICK_S, _nothing),) if self._no_world is not None else super().timers()

    def holds_attempt(self) -> bool:
        if self._no_world is not None:
            return not self._no_world_told
        return super().holds_attempt()

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        """Restart (in a new world: ``begin_attempt`` forms it) iff this node wishes it, the fate
        re-forms and no node vetoes."""
        if self._no_world is not None:
            return False
        fate = self.fates.get(self.attempt)
        if fate is None or (fate.kind == StopKind.LOST.value and fate.node == self.opt.nodes[0]):
            return False  # the first node hosts the rendezvous: no next world without it
        vetoed = any(o not in _REFORMING_OUTCOMES for o in self.outcomes.get(self.attempt, ()))
        return wish and fate.kind in _REFORMING_FATES and not vetoed

    @property
    def exclusions(self) -> list[Exclusion]:
        """The nodes taken out of this job so far, in order (the report's ``exclusions[]``)."""
        return self.exclusion_log.exclusions

    @exclusions.setter
    def exclusions(self, found: list[Exclusion]) -> None:
        self.exclusion_log.exclusions = found

    def take_out(self, node_rank: int, reason: str, evidence: str, step_time_before_s: float | None = None) -> None:
        """(The first node.) Leave node rank ``node_rank`` of the running world out of the next one, for
        good (the straggler policy, which stops the running world itself)."""
        self._leave.append(Leave(node_rank, reason, evidence, step_time_before_s))

    def _reform(self, before: Fate | None, fault: Fault | None = None) -> None:
        """The next world (without the previous attempt's lost node and the nodes taken out), its plan,
        its nodes met; ``fault``: this node's own (it leaves the job)."""
        names = self.opt.nodes
        lost = (
            [names.index(before.node)] if before and before.kind == StopKind.LOST.value and before.node in names else []
        )
        leave, self._leave = tuple(self._leave), []
        try:
            lost_text = before.headline if before is not None and lost else ""
            answer = self._step(Reform(tuple(lost), fault, lost_text, leave), WorldAnswer)
            self.exclusion_log.record(answer.excluded, self.is_host)
            if answer.taken_out is not None:
                self.exclusions.append(answer.taken_out)  # in its own report too (said once, below)
                text = f"{answer.taken_out.line}: this node runs no more ranks; the job goes on without it"
                self.say(f"openclaw-launch: {text}")
                self._no_world = StopReason(StopKind.TAKEN_OUT, TAKEN_OUT, text, False, self.name)
                self._no_world_told = False
                return
            if answer.world is None:
                raise AgentError(answer.why)
            self.world = answer.world
            self.plan, nodes, fingerprint = self.replan(self.world)
            self.me, self.name, self.is_host = self.plan.node_rank, self.plan.node, self.plan.node_rank == 0
            self.opt = dataclasses.replace(self.opt, nodes=nodes)
            self.lost_nodes = set()  # names are the new world's
            self.join(fingerprint, _no_signal)
        except AgentError as e:
            text = f"no next world: {e}"
            self.say(f"openclaw-launch: {text}")
            self._no_world = StopReason(StopKind.LOST, EXIT_NODE_LOST, text, False, self.name)
            self._no_world_told = False
            return
        self.say(
            f"openclaw-launch: world {self.world.round}: node rank {self.world.node_rank} of {self.world.nnodes} "
            f"(world size {self.plan.world_size})"
        )
        self.start()

    def finish(self, payload: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
        if self.is_host:  # standbys still waiting stop waiting
            self._step(JobDone(), StepTaken)
        return super().finish(payload)

    def _step(self, step: Message, answer: type[Answer]) -> Answer:
        got = self.elastic_link.step(step, answer, self.say, _no_signal)
        assert not isinstance(got, int)
        return got


def _nothing() -> None:
    return None


def _no_signal() -> int | None:
    """Between attempts the supervisor sees the signals once the step is answered."""
    return None


def _no_fault(attempt: int) -> Fault | None:
    return None
