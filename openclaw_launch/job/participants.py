"""The participants one attempt of this node's run is supervised with (run/participant.py's
contract): the report modules' early load, the failure policy, the MPS daemon and the job cgroup,
the statistics' parts, the agent and the workers' store. Composed here, in one list, so the run's wiring shows every
voice supervision asks."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from openclaw_launch.run.participant import Participant
from openclaw_launch.run.setup import CgroupParticipant, MpsParticipant
from openclaw_launch.stats.wiring import statistics_participants

if TYPE_CHECKING:
    from openclaw_launch.agents.fate import Agent
    from openclaw_launch.agents.worker_store import WorkerStore
    from openclaw_launch.run import cgroup
    from openclaw_launch.run.failure_policy import FailurePolicy
    from openclaw_launch.run.mps.daemon import MpsDaemon
    from openclaw_launch.stats.session import StatsSession


def participants_of(
    local_ranks: int,
    policy: FailurePolicy,
    daemon: MpsDaemon | None,
    job_cgroup: cgroup.JobCgroup | None,
    session: StatsSession | None,
    agent: Agent | None,
    store: WorkerStore | None = None,
) -> list[Participant]:
    """Every part of this run that supervision asks, in the order it asks them."""
    participants: list[Participant] = [ReportModules(local_ranks), policy]
    if daemon is not None and daemon.pid is not None:
        participants.append(MpsParticipant(daemon.pid))
    if job_cgroup is not None:
        participants.append(CgroupParticipant(job_cgroup))
    if session is not None:
        participants += statistics_participants(session)
    if agent is not None:
        participants.append(agent)
    if store is not None:  # after the agent: an elastic world's ranks are the agent's answer
        participants.append(store)
    return participants


class ReportModules(Participant):
    """Loads the report's modules (~20 frozen types, the verdict: ~25 ms of CPU) right after this
    node's last worker is spawned, while the workers start, where a CPU is left over for it (more
    usable CPUs than local ranks): then neither the start nor the clean exit waits for them. With no
    CPU to spare that import would delay the workers' start (2-core box: 25-30 ms at N=4 and 8), and
    it happens at the end instead."""

    def __init__(self, local_ranks: int) -> None:
        self.spawns_left = local_ranks if len(os.sched_getaffinity(0)) > local_ranks else None

    def on_spawn(self, rank: int, pid: int) -> None:
        if self.spawns_left is None:
            return
        self.spawns_left -= 1
        if self.spawns_left == 0:
            from openclaw_launch.report.build import build_report  # noqa: F401 - used at the end
            from openclaw_launch.report.format import format_report  # noqa: F401
