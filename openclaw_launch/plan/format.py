"""How a LaunchPlan is shown: the plain-text table (``openclaw-launch plan``, ``run``) and its JSON.

``plan`` re-exports these names; the plan types are imported for annotations only, so this module
can be imported by ``plan`` itself.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from openclaw_launch.topology.cpulist import format_cpulist

if TYPE_CHECKING:
    from openclaw_launch.plan.build import LaunchPlan, RankPlan

PLAN_SCHEMA = 1


def format_plan_table(plan: LaunchPlan, *, warnings: bool = True) -> str:
    """The plan as plain text: one row per rank, then (unless the caller prints them) the warnings."""
    header = ("rank", "local", "node", "gpu", "bus", "numa", "cpus", "mem", "argv")
    rows = [header] + [
        (
            str(r.rank),
            str(r.local_rank),
            r.node,
            _short_uuid(r.gpu_uuid) if r.gpu_index is None else f"{r.gpu_index}:{_short_uuid(r.gpu_uuid)}",
            r.pci_bus_id or "-",
            "-" if r.numa_node is None else str(r.numa_node),
            format_cpulist(r.cpus) or "-",
            r.mem_policy + (f":{','.join(map(str, r.mem_nodes))}" if r.mem_nodes else ""),
            shlex.join(r.argv),
        )
        for r in plan.ranks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        f"run {plan.run_id}  node {plan.node} ({plan.node_rank + 1}/{plan.nnodes})  world size "
        f"{plan.world_size}  master {plan.master_addr}:{plan.master_port}  backend {plan.backend}"
        + ("  MPS on" if plan.mps else "")
    ]
    lines += ["  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip() for row in rows]
    if warnings:
        lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def _short_uuid(uuid: str | None) -> str:
    """``GPU-7a3b1c9d-ef01-...`` -> ``GPU-7a3b1c9d``: enough to tell GPUs apart in a table."""
    if uuid is None:
        return "cpu"
    head, _, rest = uuid.partition("-")
    return f"{head}-{rest.split('-')[0]}" if rest else uuid


def plan_to_json(plan: LaunchPlan) -> dict[str, object]:
    """The plan as JSON (``openclaw-launch plan --json``, the run report): schema, job, MPS, ranks."""
    return {
        "schema": PLAN_SCHEMA,
        "run_id": plan.run_id,
        "node": plan.node,
        "node_rank": plan.node_rank,
        "nnodes": plan.nnodes,
        "world_size": plan.world_size,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "backend": plan.backend,
        "mps": None
        if plan.mps is None
        else {
            "max_clients_per_gpu": plan.mps.max_clients_per_gpu,
            "active_thread_percentage": plan.mps.active_thread_percentage,
            "pinned_device_mem_limit": plan.mps.pinned_device_mem_limit,
            "on_start_failure": plan.mps.on_start_failure,
            "gpu_uuids": list(plan.mps.gpu_uuids),
        },
        "warnings": list(plan.warnings),
        "telemetry_socket": plan.telemetry_socket,
        "parallel": plan.parallel.to_json() if plan.parallel is not None else None,
        "ranks": [r.to_json() for r in plan.ranks],
    }


def rank_to_json(r: RankPlan) -> dict[str, object]:
    """One rank of the plan as JSON."""
    return {
        "rank": r.rank,
        "local_rank": r.local_rank,
        "node": r.node,
        "node_rank": r.node_rank,
        "gpu_uuid": r.gpu_uuid,
        "gpu_index": r.gpu_index,
        "pci_bus_id": r.pci_bus_id,
        "numa_node": r.numa_node,
        "cpus": list(r.cpus),
        "mem_policy": r.mem_policy,
        "mem_nodes": list(r.mem_nodes),
        "argv": list(r.argv),
        "env": dict(r.env),
    }
