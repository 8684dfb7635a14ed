"""GPU memory asymmetry between ranks of the same role: a rank that holds more state than its peers
means the partitioning (the sharding, the data-parallel replicas' split, a stage's layers) is uneven.

Ranks of one role should hold the same: every rank when the plan has no pipeline stages, else the
ranks of one stage (stages hold different layers by design; plan/parallel.py's ``pp`` coordinate).
The memory is NVML's most used per GPU over the run (stats/gpu.py), which counts every process on
the GPU; a GPU that several ranks share (MPS) counts for each of them its memory over their number.
Pure: the plan's ranks and the GPUs' summaries in, findings out; for the job report, every node's
ranks' memory and role (``RankMemory``) in, the job's findings out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openclaw_launch.stats.result import MEMORY_ASYMMETRY_SHARE as ASYMMETRY_SHARE
from openclaw_launch.stats.result import GpuStats, MemoryAsymmetry

if TYPE_CHECKING:
    from openclaw_launch.plan.model import RankPlan
    from openclaw_launch.plan.parallel import ParallelLayout
_MIB_PER_GIB = 1024.0


def role_of(rank: int, parallel: ParallelLayout | None) -> str:
    """The ranks it is compared with: ``all``, or its pipeline stage ``pp=N``."""
    if parallel is None or parallel.pp <= 1 or rank not in parallel.order:
        return "all"
    return f"pp={parallel.coords(rank)['pp']}"


@dataclass(frozen=True)
class RankMemory:
    """One rank's peak GPU memory and its role, as its node sends them for the job report (the role
    comes from the node's plan; the first node compares every node's ranks of one role)."""

    rank: int
    node: str
    role: str
    mib: float


def rank_memory(
    ranks: Sequence[RankPlan], parallel: ParallelLayout | None, gpus: Mapping[str, GpuStats]
) -> tuple[RankMemory, ...]:
    """Each GPU rank's memory (its GPU's most used over the ranks sharing it) and role."""
    sharing: dict[str, int] = {}
    for r in ranks:
        if r.gpu_uuid:
            sharing[r.gpu_uuid] = sharing.get(r.gpu_uuid, 0) + 1
    out = []
    for r in ranks:
        gpu = gpus.get(r.gpu_uuid) if r.gpu_uuid else None
        if gpu is not None and gpu.memory_used_mib_max is not None:
            mib = gpu.memory_used_mib_max / sharing[r.gpu_uuid or ""]
            out.append(RankMemory(r.rank, r.node, role_of(r.rank, parallel), mib))
    return tuple(out)


def find_asymmetry(
    ranks: Sequence[RankPlan], parallel: ParallelLayout | None, gpus: Mapping[str, GpuStats]
) -> tuple[MemoryAsymmetry, ...]:
    """A node's findings: ``asymmetry`` over its ranks' ``rank_memory``."""
    return asymmetry(rank_memory(ranks, parallel, gpus))


def asymmetry(memories: Sequence[RankMemory]) -> tuple[MemoryAsymmetry, ...]:
    """Every rank whose memory differs from the median of its role by more than ``ASYMMETRY_SHARE``
    of it, the most different first (a node's ranks, or every node's for the job report). In a role
    of two, each is compared with the other and only the one that holds more is named (the pair's
    asymmetry, once); in a larger role, one that holds less is named too."""
    roles: dict[str, list[RankMemory]] = {}
    for m in memories:
        roles.setdefault(m.role, []).append(m)
    found = []
    for _, members in sorted(roles.items()):
        if len(members) < 2:
            continue
        role_median = statistics.median(m.mib for m in members)
        for m in members:
            # of two, the median is their mean and both would differ: each is compared with the other
            peers = role_median if len(members) > 2 else next(o.mib for o in members if o is not m)
            excess = m.mib - peers
            if peers <= 0 or abs(excess) <= ASYMMETRY_SHARE * peers or (excess < 0 and len(members) == 2):
                continue
            found.append(_finding(m, peers))
    return tuple(sorted(found, key=lambda f: (-abs(f.excess_gib), f.rank)))


def _finding(m: RankMemory, peers_mib: float) -> MemoryAsymmetry:
    memory, peers = m.mib / _MIB_PER_GIB, peers_mib / _MIB_PER_GIB
    excess = memory - peers
    more = "more" if excess > 0 else "less"
    whose = "its peers" if m.role == "all" else f"the other ranks of pipeline stage {m.role[3:]}"
    text = (
        f"memory: rank {m.rank} on node {m.node} holds {abs(excess):.1f} GiB {more} than {whose} "
        f"({memory:.1f} GiB against {peers:.1f} GiB, over {100 * ASYMMETRY_SHARE:.0f} %): the "
        "partitioning/sharding is uneven"
    )
    return MemoryAsymmetry(
        rank=m.rank,
        node=m.node,
        role=m.role,
        memory_gib=round(memory, 3),
        peers_gib=round(peers, 3),
        excess_gib=round(excess, 3),
        text=text,
    )


def live_text(found: Sequence[MemoryAsymmetry]) -> str:
    """The live line's part: the most different rank, when there is one."""
    if not found:
        return ""
    f = found[0]
    more = "more" if f.excess_gib > 0 else "less"
    return f"; memory: rank {f.rank} holds {abs(f.excess_gib):.1f} GiB {more} than its peers"
