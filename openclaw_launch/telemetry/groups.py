"""Process groups as the statistics name them: one key per group, the same on both sides.

A worker books each wait in a collective or point-to-point call to the call's process group
(telemetry/torch_hooks.py) under ``group_key``: the group's global ranks and, for a group that
torch's ``DeviceMesh`` made, its mesh dimension. The launcher (stats/groups.py) makes the same key
for each group of the plan's parallel layout, so it names a group ``dp``/``tp``/``pp`` by its ranks
alone. Pure, standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

SPELLED_RANKS = 32  # a group of at most this many ranks is keyed by its ranks spelled out
MESH_PREFIX = "mesh_"  # DeviceMesh's groups: ``group_desc`` "mesh_<dim name>"
UNNAMED_MESH_DIM = "default"  # torch's name for the dimension of a 1-D mesh made without names


def ranks_text(ranks: Sequence[int]) -> str:
    """The ranks, short and readable: ``0,1,2,3``; over ``SPELLED_RANKS``, ``0-62/2`` (evenly
    spaced) or ``0..63#40#<checksum>`` (first, last, count: another such group differs in them or
    in the checksum)."""
    ordered = sorted(ranks)
    if len(ordered) <= SPELLED_RANKS:
        return ",".join(str(r) for r in ordered)
    stride = ordered[1] - ordered[0]
    if all(b - a == stride for a, b in zip(ordered, ordered[1:], strict=False)):
        return f"{ordered[0]}-{ordered[-1]}/{stride}"
    checksum = sum((i + 1) * r for i, r in enumerate(ordered)) % 1_000_003
    return f"{ordered[0]}..{ordered[-1]}#{len(ordered)}#{checksum}"


def group_key(ranks: Sequence[int], mesh_dim: str = "") -> str:
    """``<mesh dim>@<ranks>``: what a worker books a group's waits under (``mesh_dim`` empty when
    the group is no DeviceMesh dimension)."""
    return f"{mesh_dim}@{ranks_text(ranks)}"


def mesh_dim_of(group_desc: str) -> str:
    """The DeviceMesh dimension a group's ``group_desc`` names; empty for another group, or for a
    mesh made without names (FSDP2's ``fully_shard`` without a mesh: its world is no dimension)."""
    if not group_desc.startswith(MESH_PREFIX):
        return ""
    dim = group_desc[len(MESH_PREFIX) :]
    return "" if dim == UNNAMED_MESH_DIM else dim


def split_key(key: str) -> tuple[str, str]:
    """``(mesh dim, ranks text)`` of a ``group_key``."""
    mesh_dim, _, ranks = key.partition("@")
    return mesh_dim, ranks
