"""The nodes' meeting before the plan is built: node ranks by arrival (c10d without --node-rank) and
an elastic job's first world. The launcher waits there with its stopping signals caught, so that a
signal ends the wait as its number (nothing started: the command exits 128+N), and holds a free port
that becomes the workers' MASTER_PORT if it is node rank 0 (the others let theirs go)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from openclaw_launch.job.agents import AgentWaits, ElasticJob, agent_options
from openclaw_launch.plan.context import free_port, release_port
from openclaw_launch.run.osproc import RealOs

if TYPE_CHECKING:
    from openclaw_launch.agents.elastic_link import ElasticLink, NotNeeded, World
    from openclaw_launch.agents.fate import Arrival

_Answer = TypeVar("_Answer")
#: A meeting: (this launcher's free port, the signal that stopped the wait so far) -> its answer.
_Meet = Callable[[int, Callable[[], "int | None"]], _Answer]


def meet_by_arrival(
    addr: str,
    port: int,
    nnodes: int,
    waits: AgentWaits,
    signals: tuple[int, ...],
    say: Callable[[str], None],
    rdzv_id: str = "none",
) -> Arrival | int:
    """This launcher's node rank of ``nnodes`` and the workers' MASTER_PORT, by arrival at the
    rendezvous ``addr:port`` (the agents' store); a signal's number if one stopped the wait.
    ``AgentError`` if refused (a launcher too many, or another ``--rdzv-id``) or nothing answered."""
    from openclaw_launch.agents.fate import Arrival, arrive

    options = agent_options(addr, port, waits)  # nodes and restarts: the plan's, given later

    def meet(free: int, interrupted: Callable[[], int | None]) -> Arrival | int:
        return arrive(options, nnodes, free, say, interrupted, rdzv_id)

    return _meeting(signals, meet, lambda answer: answer.node_rank if isinstance(answer, Arrival) else None)


def meet_first_world(
    job: ElasticJob, waits: AgentWaits, max_restarts: int, signals: tuple[int, ...], say: Callable[[str], None]
) -> tuple[World, ElasticLink] | NotNeeded | int:
    """Join an elastic job's rendezvous and wait for the first world that holds this launcher (a
    standby: until it replaces a lost node): that world and the helper, ``NotNeeded`` when the job
    ended without it, or a signal's number. ``AgentError`` if refused."""
    from openclaw_launch.agents.elastic_link import elastic_arrive

    options = agent_options(job.addr, job.port, waits, max_restarts=max_restarts)

    def meet(free: int, interrupted: Callable[[], int | None]) -> tuple[World, ElasticLink] | NotNeeded | int:
        return elastic_arrive(options, job.spec, job.standby, job.node, free, say, interrupted, job.rdzv_id)

    return _meeting(signals, meet, lambda answer: answer[0].node_rank if isinstance(answer, tuple) else None)


def _meeting(signals: tuple[int, ...], meet: _Meet[_Answer], node_rank: Callable[[_Answer], int | None]) -> _Answer:
    """``meet`` with ``signals`` caught and a free port held; the port is let go unless the answer
    made this launcher node rank 0."""
    os_layer = RealOs()
    os_layer.install_signals(signals)
    port = free_port()
    try:
        answer = meet(port, lambda: next(iter(os_layer.drain_signals()), None))
    finally:
        os_layer.restore_signals()
    if node_rank(answer) != 0:
        release_port(port)
    return answer
