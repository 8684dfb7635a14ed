"""Tensor / pipeline / data parallel layout: which global ranks form each TP, PP and DP group.

Pure (config + sizes -> layout, no I/O) and torch-free, so the plan can show it and a worker can
read it with a cheap import (``openclaw_launch.parallel_groups()``).

Why the launcher decides this: tensor parallelism moves the most data, so a TP group must sit on
one node and, where the node allows, on GPUs joined by NVLink. Global ranks follow the config's
GPU order, and NVLink pairs are not always index neighbours (the V100 hybrid cube mesh, some PCIe
boxes with bridges), so "TP = consecutive ranks" can put a TP group across the PCIe switch. The
layout here is a mesh over a rank *order* that keeps NVLink-joined GPUs together, computed from
the config's ``nvlink_peers`` only: every node's launcher computes the same layout.

Mesh convention (Megatron's and ``init_device_mesh``'s): dims ``(pp, dp, tp)``, row-major, TP
innermost. When the order is the identity, ``init_device_mesh(device, mesh_shape,
mesh_dim_names=...)`` builds it; otherwise ``DeviceMesh(device, mesh, mesh_dim_names=...)``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_launch.config.model import Config, NodeSpec, node_rank_counts
from openclaw_launch.config.parallel import PARALLEL_DIMS, ParallelSpec, size_problems

#: Mesh dimensions, outermost first (TP innermost: its ranks are adjacent in the mesh).
MESH_DIM_NAMES: tuple[str, ...] = ("pp", "dp", "tp")
#: The groups file a run writes in its run directory; ``OPENCLAW_PARALLEL_FILE`` names it.
PARALLEL_FILE_NAME = "parallel.json"
PARALLEL_FILE_ENV = "OPENCLAW_PARALLEL_FILE"
#: Above this many GPUs on a node the NVLink grouping is greedy instead of an exhaustive search.
_EXACT_SEARCH_MAX_GPUS = 16


@dataclass(frozen=True)
class ParallelLayout:
    """The groups of one job. ``order[i]`` is the global rank at flat mesh position ``i``."""

    tp: int
    pp: int
    dp: int
    order: tuple[int, ...]
    nvlinked: bool | None  # every multi-GPU TP group is NVLink-joined; None = the config has no peers

    def coords(self, rank: int) -> dict[str, int]:
        """``{"pp": i, "dp": j, "tp": k}`` of a global rank."""
        pos = self.order.index(rank)
        return {"pp": pos // (self.dp * self.tp), "dp": (pos // self.tp) % self.dp, "tp": pos % self.tp}

    def mesh(self) -> list[list[list[int]]]:
        """Global ranks as a ``[pp][dp][tp]`` nested list (``DeviceMesh``'s ``mesh``)."""
        o = self.order
        return [
            [[o[(p * self.dp + d) * self.tp + t] for t in range(self.tp)] for d in range(self.dp)]
            for p in range(self.pp)
        ]

    def groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim`` (ranks in mesh order), each group once."""
        m = self.mesh()
        if dim == "tp":
            return [row for plane in m for row in plane]
        if dim == "dp":
            return [[plane[d][t] for d in range(self.dp)] for plane in m for t in range(self.tp)]
        return [[m[p][d][t] for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    @property
    def identity(self) -> bool:
        return self.order == tuple(range(len(self.order)))

    def rank_env(self, rank: int) -> dict[str, str]:
        c = self.coords(rank)
        sizes = {"tp": self.tp, "pp": self.pp, "dp": self.dp}
        env = {}
        for d in PARALLEL_DIMS:
            env[f"OPENCLAW_{d.upper()}_RANK"] = str(c[d])
            env[f"OPENCLAW_{d.upper()}_SIZE"] = str(sizes[d])
        return env

    def to_json(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "mesh_dim_names": list(MESH_DIM_NAMES),
            "mesh_shape": [self.pp, self.dp, self.tp],
            "mesh": self.mesh(),
            "identity": self.identity,
            "tp_nvlinked": self.nvlinked,
            "groups": {d: self.groups(d) for d in PARALLEL_DIMS},
        }


def _node_ranks(config: Config) -> dict[str, int]:
    return node_rank_counts(config.nodes, config.runtime.procs_per_gpu)


def _linked(node: NodeSpec) -> Callable[[int, int], bool] | None:
    """GPU position a <-> b joined by NVLink per the config (either side may list it); None when
    the node lists no peers at all (then nothing is known)."""
    uuids = [g.uuid.lower() for g in node.gpus]
    pairs: set[frozenset[int]] = set()
    for i, g in enumerate(node.gpus):
        for peer in g.nvlink_peers:
            if peer.lower() in uuids:
                pairs.add(frozenset((i, uuids.index(peer.lower()))))
    if not pairs:
        return None
    return lambda a, b: a == b or frozenset((a, b)) in pairs


def _clique_partition(n: int, size: int, linked: Callable[[int, int], bool]) -> list[list[int]] | None:
    """Split GPUs 0..n-1 into groups of ``size`` that are all pairwise NVLinked, lowest index first;
    None when there is no such split (exhaustive for small nodes, greedy above)."""

    def clique(members: Sequence[int]) -> bool:
        return all(linked(a, b) for a, b in itertools.combinations(members, 2))

    def solve(remaining: list[int]) -> list[list[int]] | None:
        if not remaining:
            return []
        first, rest = remaining[0], remaining[1:]
        for combo in itertools.combinations(rest, size - 1):
            if not clique((first, *combo)):
                continue
            tail = solve([x for x in rest if x not in combo])
            if tail is not None:
                return [[first, *combo], *tail]
            if n > _EXACT_SEARCH_MAX_GPUS:  # greedy: no backtracking on big nodes
                return None
        return None

    return solve(list(range(n)))


def _node_order(node: NodeSpec, tp: int, procs_per_gpu: int) -> tuple[list[int], bool | None]:
    """Local ranks of one node in mesh order, and whether its TP groups are NVLink-joined."""
    if node.cpu_workers is not None:
        return list(range(node.cpu_workers)), None
    k = procs_per_gpu
    n = len(node.gpus)
    identity = list(range(n * k))
    if tp <= k or tp % k:  # TP inside one GPU (MPS), or groups that cut across GPUs' rank blocks
        return identity, None
    linked = _linked(node)
    if linked is None:
        return identity, None
    gpu_groups = _clique_partition(n, tp // k, linked)
    if gpu_groups is None:
        return identity, False
    return [g * k + j for group in gpu_groups for g in group for j in range(k)], True


def plan_parallel(config: Config, spec: ParallelSpec) -> ParallelLayout:
    """The layout of the whole job. Call ``size_problems`` first: sizes here are assumed valid."""
    node_ranks = _node_ranks(config)
    world = sum(node_ranks.values())
    tp, pp = spec.tp or 1, spec.pp or 1
    dp = spec.dp if spec.dp is not None else world // (tp * pp)
    order: list[int] = []
    verdicts: list[bool | None] = []
    for node in config.nodes:
        local, joined = _node_order(node, tp, config.runtime.procs_per_gpu)
        order += [len(order) + r for r in local]
        verdicts.append(joined)
    known = [v for v in verdicts if v is not None]
    nvlinked = all(known) if known else None
    return ParallelLayout(tp=tp, pp=pp, dp=dp, order=tuple(order), nvlinked=nvlinked)


def layout_warnings(layout: ParallelLayout, config: Config) -> list[str]:
    """What the plan should say about a layout that is valid but slower than it could be."""
    out: list[str] = []
    gpu_tp = layout.tp > config.runtime.procs_per_gpu and any(n.gpus for n in config.nodes)
    if gpu_tp and layout.nvlinked is False:
        out.append(
            f"tp={layout.tp}: the nodes' GPUs cannot be split into NVLink-joined groups of "
            f"{layout.tp // config.runtime.procs_per_gpu} (per nvlink_peers); TP groups cross PCIe"
        )
    elif gpu_tp and layout.nvlinked is None:
        out.append(
            f"tp={layout.tp}: the config lists no nvlink_peers, so TP groups follow the GPU order "
            "(openclaw-launch discover writes them)"
        )
    return out


@dataclass(frozen=True)
class Suggestion:
    tp: int
    pp: int
    dp: int
    nvlinked: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "tp_nvlinked": self.nvlinked}


def suggest_layouts(config: Config) -> list[Suggestion]:
    """Every TP size that fits each node (pp 1, dp the rest), largest NVLink-joined TP first.

    PP is left at 1: how many stages a model wants depends on the model, not on the machine.
    """
    node_ranks = _node_ranks(config)
    world = sum(node_ranks.values())
    smallest = min(node_ranks.values(), default=1)
    out = []
    for tp in range(1, smallest + 1):
        spec = ParallelSpec(tp=tp)
        if size_problems(spec, world, node_ranks):
            continue
        layout = plan_parallel(config, spec)
        out.append(Suggestion(tp, 1, world // tp, True if tp == 1 else layout.nvlinked))
    return sorted(out, key=lambda s: (s.nvlinked is not True, -s.tp))


def format_suggestions(suggestions: Sequence[Suggestion]) -> str:
    lines = ["tp  pp  dp  TP groups on NVLink"]
    for s in suggestions:
        joined = {True: "yes", False: "no (crosses PCIe)", None: "unknown (no nvlink_peers)"}[s.nvlinked]
        lines.append(f"{s.tp:<3} {s.pp:<3} {s.dp:<3} {joined}")
    return "\n".join(lines)


# --- the worker side: cheap, no torch -------------------------------------------------------------


@dataclass(frozen=True)
class ParallelGroups:
    """What a rank needs to build its process groups or device mesh."""

    rank: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    groups: Mapping[str, list[list[int]]]  # "tp"/"pp"/"dp" -> every group of that kind
    mesh: list[list[list[int]]]
    mesh_dim_names: tuple[str, ...] = MESH_DIM_NAMES
    identity: bool = True

    def group_of(self, dim: str) -> list[int]:
        """This rank's group along ``dim``."""
        return next(g for g in self.groups[dim] if self.rank in g)

    def init_device_mesh_args(self) -> dict[str, Any]:
        """``init_device_mesh(device, **args)`` when the order is the identity; otherwise use
        ``DeviceMesh(device, self.mesh, mesh_dim_names=self.mesh_dim_names)``."""
        if not self.identity:
            raise ValueError(
                "the layout reorders ranks for NVLink; build DeviceMesh(device, groups.mesh, "
                "mesh_dim_names=groups.mesh_dim_names) instead"
            )
        return {"mesh_shape": (self.pp, self.dp, self.tp), "mesh_dim_names": self.mesh_dim_names}


def parallel_groups(env: Mapping[str, str] | None = None) -> ParallelGroups:
    """This rank's groups, from the run's ``parallel.json`` (``OPENCLAW_PARALLEL_FILE``).

    Without the file (a ``plan`` printed by hand, or ``--tp`` not given) the sizes in
    ``OPENCLAW_{TP,PP,DP}_SIZE`` give the identity layout; without those, everything is DP.
    """
    env = os.environ if env is None else env
    rank = int(env.get("RANK", "0"))
    path = env.get(PARALLEL_FILE_ENV)
    if path:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        tp, pp, dp = int(data["tp"]), int(data["pp"]), int(data["dp"])
        order = tuple(r for plane in data["mesh"] for row in plane for r in row)
        layout = ParallelLayout(tp, pp, dp, order, data.get("tp_nvlinked"))
    else:
        world = int(env.get("WORLD_SIZE", "1"))
        tp = int(env.get("OPENCLAW_TP_SIZE", "1"))
        pp = int(env.get("OPENCLAW_PP_SIZE", "1"))
        dp = int(env.get("OPENCLAW_DP_SIZE", str(max(1, world // (tp * pp)))))
        layout = ParallelLayout(tp, pp, dp, tuple(range(tp * pp * dp)), None)
    c = layout.coords(rank)
    return ParallelGroups(
        rank=rank,
        tp=layout.tp,
        pp=layout.pp,
        dp=layout.dp,
        tp_rank=c["tp"],
        pp_rank=c["pp"],
        dp_rank=c["dp"],
        groups={d: layout.groups(d) for d in PARALLEL_DIMS},
        mesh=layout.mesh(),
        identity=layout.identity,
    )
