"""Process groups by name: the workers book their waits per group key (telemetry/groups.py); this
names each key as the user laid the job out.

A group whose ranks are one of the plan's parallel groups (plan/parallel.py: the launcher laid out
``dp``/``tp``/``pp``) takes that dimension's name; else a DeviceMesh dimension's name (torch's
``mesh_<dim>`` groups: ``dp_shard``, ``tp``, ...); else ``world`` for every rank; else its ranks
(``ranks 0,2,4,6``). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from openclaw_launch.telemetry.groups import ranks_text, split_key

if TYPE_CHECKING:
    from openclaw_launch.plan.parallel import ParallelLayout

SHOWN_GROUPS = 4  # groups a waits line names, the longest first
MIN_SHOWN_SHARE = 0.005  # a group waited in for less than this share of the step is left out


def namer(parallel: ParallelLayout | None, world_size: int) -> Callable[[str], str]:
    """A key's name, from the plan's layout (``parallel``) and its world."""
    by_ranks: dict[str, str] = {}
    if parallel is not None:
        for dim in ("pp", "dp", "tp"):  # a dimension of size 1 has one-rank groups: no waits
            if getattr(parallel, dim) > 1:
                by_ranks.update({ranks_text(g): dim for g in parallel.groups(dim)})
    world = ranks_text(range(world_size)) if world_size > 0 else ""

    def name(key: str) -> str:
        mesh_dim, ranks = split_key(key)
        if ranks in by_ranks:
            return by_ranks[ranks]
        if mesh_dim:
            return mesh_dim
        return "world" if ranks == world else f"ranks {ranks}"

    return name


def waits_text(shares: Mapping[str, float]) -> str:
    """``pp 40 %, dp 5 %``: the groups waited in most, as shares of the step."""
    shown = sorted(((s, g) for g, s in shares.items() if s >= MIN_SHOWN_SHARE), reverse=True)[:SHOWN_GROUPS]
    return ", ".join(f"{g} {100 * s:.0f} %" for s, g in shown)
