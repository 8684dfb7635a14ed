"""The elastic agent's helper (``--nnodes MIN:MAX``): the membership's steps between the launcher
(``ElasticLink``) and its agent helper (``_ElasticLoop``: agents/store_loop.py's loop with the
rendezvous, agents/elastic.py), and the launcher's arrival in its first world (``elastic_arrive``).

The messages (``ELASTIC_VOCABULARY``): ``ElasticArrive`` and ``Reform`` are answered with
``WorldAnswer`` (this launcher's world, or why there is none), ``WorldRunning`` and ``JobDone`` with
``StepTaken``; the straggler policy's ``ExcludeNode`` with its fate, or ``ExcludeRefused``
(agents/straggler_actions.py). The agent that takes these steps is agents/elastic_agent.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from openclaw_launch.agents.elastic import Rendezvous
from openclaw_launch.agents.exclusions import Fault, Leave, exclusions_of
from openclaw_launch.agents.fate import AgentOptions, Fate, lost_fate
from openclaw_launch.agents.membership import ElasticSpec
from openclaw_launch.agents.store import AgentError, AgentStore
from openclaw_launch.agents.store_link import Answer, StoreLink
from openclaw_launch.agents.store_loop import LoopOptions, LostFate, StoreLoop
from openclaw_launch.agents.store_messages import VOCABULARY
from openclaw_launch.agents.straggler_actions import ExcludeNode, ExcludeRefused
from openclaw_launch.codec import from_json
from openclaw_launch.report.membership import Exclusion
from openclaw_launch.run.helper import Helper, Link, Message, Vocabulary


@dataclass(frozen=True)
class World:
    """This launcher's place in one world of the job."""

    round: int  # the world's number: the job's attempt
    node_rank: int
    nnodes: int
    master_port: int
    tokens: tuple[str, ...]  # every node's launcher (host, pid, a random part) by node rank
    nodes: tuple[str, ...]  # with --config: every node's name by node rank (else empty names)


@dataclass(frozen=True)
class NotNeeded:
    """The job ended (or fell below MIN) while this launcher waited (a standby, or one too many)."""

    text: str


# ---- launcher -> helper: the membership's steps ---------------------------------------------------


@dataclass(frozen=True)
class ElasticArrive(Message):
    """Join the rendezvous (the first node: set it up and form the first world)."""

    spec: ElasticSpec
    max_restarts: int
    token: str
    standby: bool
    node: str  # this launcher's config node, or ""
    master_port: int
    rdzv_id: str = "none"  # --rdzv-id: the rendezvous's keys are under it (torchrun's default id: none)


@dataclass(frozen=True)
class Reform(Message):
    """The world ended: the next one, less ``lost_ranks`` (the fate's lost node, ``lost_text`` its
    words) and the nodes taken out (agents/exclusions.py): this node itself for its ``fault``, and
    those the first node's launcher names (``leave``)."""

    lost_ranks: tuple[int, ...]
    fault: Fault | None = None
    lost_text: str = ""
    leave: tuple[Leave, ...] = ()


@dataclass(frozen=True)
class WorldRunning(Message):
    """The world's workers start: from now on a loss or an arrival stops them."""


@dataclass(frozen=True)
class JobDone(Message):
    """The job ended (the first node: waiting members stop waiting)."""


# ---- helper -> launcher: each step's answer -------------------------------------------------------


@dataclass(frozen=True)
class WorldAnswer(Message):
    world: World | None  # this launcher's place in the newest world that holds it; None: none does
    why: str = ""  # why none: the job ended without it, or fewer than MIN nodes are left
    excluded: tuple[Exclusion, ...] = ()  # the nodes taken out at this re-forming
    taken_out: Exclusion | None = None  # this node was (it runs no more ranks)


@dataclass(frozen=True)
class StepTaken(Message):
    pass


ELASTIC_VOCABULARY = Vocabulary(
    to_helper=(*VOCABULARY.to_helper, ElasticArrive, Reform, WorldRunning, JobDone, ExcludeNode),
    to_launcher=(*VOCABULARY.to_launcher, WorldAnswer, StepTaken, ExcludeRefused),
)


class ElasticLink(StoreLink):
    """The launcher's side of the elastic helper."""

    @classmethod
    def start(cls, options: LoopOptions, lost_fate: LostFate) -> ElasticLink:
        def main(link: Link) -> None:
            _ElasticLoop(link, options, lost_fate).serve()

        return cls(Helper.fork("openclaw-agent", main, ELASTIC_VOCABULARY), options)

    def step(
        self, step: Message, answer: type[Answer], say: Callable[[str], None], interrupted: Callable[[], int | None]
    ) -> Answer | int:
        """One membership step, and its ``answer`` when done (a signal's number if one stopped the wait)."""
        return self._exchange(step, answer, say, interrupted, ticking=True)

    def ask_exclude(self, node_rank: int, fate: str) -> None:
        """The first node: stop the world to take ``node_rank`` out (answered by its fate, or a refusal)."""
        self._helper.link.send(ExcludeNode(node_rank, fate))


class _ElasticLoop(StoreLoop):
    """The helper's loop, with the rendezvous: it opens the store, and every world's scope."""

    def __init__(self, link: Link, options: LoopOptions, lost_fate: LostFate) -> None:
        super().__init__(link, options, lost_fate)
        self.rendezvous: Rendezvous | None = None
        self._unscoped: AgentStore | None = None  # the store of every world's keys and the rendezvous's

    def _meet(self, message: Message) -> None:
        match message:
            case ElasticArrive():
                rendezvous, store = self._rendezvous(message)
                rendezvous.register(message.token, message.standby, message.master_port, message.node)
                if store.is_host:
                    rendezvous.form_first()
                self._post_world(rendezvous, store)
            case Reform():
                rendezvous, store = self._joined()
                self._stop.set()  # this world's keep-alive loop and watchdog end; the next world's start anew
                if self._thread is not None:
                    self._thread.join(timeout=self.opt.keepalive_s + 1)
                self._stop.clear()
                if store.is_host:
                    rendezvous.reform(set(message.lost_ranks), message.fault, message.lost_text, message.leave)
                else:
                    rendezvous.ready(message.fault)
                self._post_world(rendezvous, store)
            case WorldRunning():
                rendezvous, _ = self._joined()
                rendezvous.names = self.nodes
                rendezvous.running()
                self._post(StepTaken())
            case JobDone():
                self._joined()[0].finish()
                self._post(StepTaken())
            case ExcludeNode(node_rank=node_rank, fate=fate):
                why = self._joined()[0].exclude(node_rank, Fate.from_json(fate))
                if why is not None:
                    self._post(ExcludeRefused(why))
            case _:
                super()._meet(message)

    def _rendezvous(self, arrive: ElasticArrive) -> tuple[Rendezvous, AgentStore]:
        """The rendezvous, set up at the first step (it opens the store)."""
        if self.rendezvous is None or self._unscoped is None:
            self._unscoped = self._open(None)
            self.rendezvous = Rendezvous(
                self._unscoped,
                arrive.spec,
                arrive.max_restarts,
                self.opt.join_timeout_s,
                self._say,
                arrive.rdzv_id,
                self.opt.keepalive_s,
            )
        return self.rendezvous, self._unscoped

    def _joined(self) -> tuple[Rendezvous, AgentStore]:
        """The rendezvous of a launcher that arrived (every later step's)."""
        if self.rendezvous is None or self._unscoped is None:
            raise AgentError("an elastic step before this launcher joined the rendezvous")
        return self.rendezvous, self._unscoped

    def _post_world(self, rendezvous: Rendezvous, store: AgentStore) -> None:
        """The newest world that holds this launcher (its keys' scope from now on), or why none."""
        answer = rendezvous.await_world(self._ticks_so_far)
        excluded = exclusions_of(answer)
        if "out" in answer:
            out = from_json(Exclusion, answer["out"])
            self._post(WorldAnswer(None, out.line, taken_out=out))
            return
        if "rank" not in answer:
            self._post(WorldAnswer(None, answer.get("closed", "the job ended"), excluded))
            return
        self.store = store.within(rendezvous.world_scope(answer["round"]))
        fields = (answer["round"], answer["rank"], answer["nnodes"], answer["master_port"])
        self._post(WorldAnswer(World(*fields, tuple(answer["tokens"]), tuple(answer["nodes"])), excluded=excluded))


def elastic_arrive(
    options: AgentOptions,
    spec: ElasticSpec,
    standby: bool,
    node: str,
    free_port: int,
    say: Callable[[str], None],
    interrupted: Callable[[], int | None],
    rdzv_id: str = "none",
) -> tuple[World, ElasticLink] | NotNeeded | int:
    """Join the rendezvous and wait for the first world that holds this launcher (a standby: until
    it replaces a lost node; ``node``: its config node, or ""). Returns the world and the helper,
    ``NotNeeded``, or a signal's number; ``AgentError`` if refused."""
    link = ElasticLink.start(options, lost_fate)
    step = ElasticArrive(spec, options.max_restarts, link.token, standby, node, free_port, rdzv_id)
    try:
        answer = link.step(step, WorldAnswer, say, interrupted)
    except BaseException:
        link.close()
        raise
    if isinstance(answer, int) or answer.world is None:
        link.close()
        return answer if isinstance(answer, int) else NotNeeded(answer.why)
    return answer.world, link
