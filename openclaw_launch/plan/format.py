"""How a LaunchPlan is shown as text: the table ``openclaw-launch plan`` and ``run --dry-run`` print
(its JSON is ``LaunchPlan.to_json`` in ``plan/model.py``)."""

from __future__ import annotations

import shlex

from openclaw_launch.plan.context import FREE_PORT_PLACEHOLDER
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.topology.cpulist import format_cpulist


def format_plan_table(plan: LaunchPlan, *, warnings: bool = True) -> str:
    """The plan as plain text: one row per rank, then (unless the caller prints them) the warnings."""
    nics = any(r.nic for r in plan.ranks)  # runtime.nic_binding: nearest
    header = ("rank", "local", "node", "gpu", "bus", "numa", "cpus", "mem", *(("nic",) if nics else ()), "argv")
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
            *((r.nic or "-",) if nics else ()),
            shlex.join(r.argv),
        )
        for r in plan.ranks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    port = FREE_PORT_PLACEHOLDER if plan.master_port is None else plan.master_port
    lines = [
        f"run {plan.run_id}  node {plan.node} ({plan.node_rank + 1}/{plan.nnodes})  world size "
        f"{plan.world_size}  master {plan.master_addr}:{port}  backend {plan.backend}"
        + ("  MPS on" if plan.mps else "")
        + (f"  hang timeout {plan.hang_timeout_s:g} s" if plan.hang_timeout_s else "")
    ]
    if plan.prewarm is not None:  # docs/plan-format.md, "prewarm"
        lines.append(
            f"prewarm {','.join(plan.prewarm.modules)}: every worker is forked from the zygote "
            f"{shlex.join(plan.prewarm.argv)}, which applies each argv's numactl flags and runs what follows "
            "its python -u"
        )
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
