"""GPU memory asymmetry between ranks of the same role: a rank that holds more state than its peers
means the partitioning (the sharding, the data-parallel replicas' split, a stage's layers) is uneven.

Ranks of one role should hold the same: every rank when the plan has no pipeline stages, else the
ranks of one stage (stages hold different layers by design; plan/parallel.py's ``pp`` coordinate).
The memory is NVML's most used per GPU over the run (stats/gpu.py), which counts every process on
the GPU; a GPU that several ranks share (MPS) counts for each of them its memory over their number.
Pure: the plan's ranks and the GPUs' summaries in, findings out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
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


def find_asymmetry(
    ranks: Sequence[RankPlan], parallel: ParallelLayout | None, gpus: Mapping[str, GpuStats]
) -> tuple[MemoryAsymmetry, ...]:
    """Every rank whose memory differs from the median of its role by more than ``ASYMMETRY_SHARE``
    of it, the most different first. In a role of two, each is compared with the other and only the
    one that holds more is named (the pair's asymmetry, once); in a larger role, one that holds less
    is named too."""
    sharing: dict[str, int] = {}
    for r in ranks:
        if r.gpu_uuid:
            sharing[r.gpu_uuid] = sharing.get(r.gpu_uuid, 0) + 1
    roles: dict[str, list[tuple[RankPlan, float]]] = {}
    for r in ranks:
        gpu = gpus.get(r.gpu_uuid) if r.gpu_uuid else None
        if gpu is not None and gpu.memory_used_mib_max is not None:
            mib = gpu.memory_used_mib_max / sharing[r.gpu_uuid or ""]
            roles.setdefault(role_of(r.rank, parallel), []).append((r, mib))
    found = []
    for role, members in sorted(roles.items()):
        if len(members) < 2:
            continue
        role_median = statistics.median(m for _, m in members)
        for r, mib in members:
            # of two, the median is their mean and both would differ: each is compared with the other
            peers = role_median if len(members) > 2 else next(m for other, m in members if other is not r)
            excess = mib - peers
            if peers <= 0 or abs(excess) <= ASYMMETRY_SHARE * peers or (excess < 0 and len(members) == 2):
                continue
            found.append(_finding(r, role, mib, peers))
    return tuple(sorted(found, key=lambda f: (-abs(f.excess_gib), f.rank)))


def _finding(r: RankPlan, role: str, mib: float, peers_mib: float) -> MemoryAsymmetry:
    memory, peers = mib / _MIB_PER_GIB, peers_mib / _MIB_PER_GIB
    excess = memory - peers
    more = "more" if excess > 0 else "less"
    whose = "its peers" if role == "all" else f"the other ranks of pipeline stage {role[3:]}"
    text = (
        f"memory: rank {r.rank} on node {r.node} holds {abs(excess):.1f} GiB {more} than {whose} "
        f"({memory:.1f} GiB against {peers:.1f} GiB, over {100 * ASYMMETRY_SHARE:.0f} %): the "
        "partitioning/sharding is uneven"
    )
    return MemoryAsymmetry(
        rank=r.rank,
        node=r.node,
        role=role,
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
