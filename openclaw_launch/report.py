"""The run report: per-rank outcome, resources and binding in force, as JSON and as a table.

Written atomically (temp file + rename) whatever the job's outcome, so a reader never sees half a
report. Schema ``openclaw-report/1``; ``openclaw-launch report RUN.json`` renders a saved one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from openclaw_launch.errors import OpenclawError
from openclaw_launch.files import write_atomic
from openclaw_launch.plan import LaunchPlan
from openclaw_launch.supervise import JobResult, WorkerResult, signal_name
from openclaw_launch.topology.cpulist import format_cpulist

SCHEMA = "openclaw-report/1"


def _rank_entry(w: WorkerResult) -> dict[str, Any]:
    return {
        "rank": w.rank,
        "local_rank": w.local_rank,
        "node": w.node,
        "attempt": w.attempt,
        "pid": w.pid,
        "exit_code": w.exit_code,
        "signal": signal_name(w.signal) if w.signal is not None else None,
        "wall_s": round(w.end_s - w.start_s, 3) if w.end_s is not None else None,
        "cpu_s": w.cpu_s,
        "max_rss_kib": w.max_rss_kib,
        "bound_cpus": format_cpulist(w.bound_cpus) if w.bound_cpus is not None else None,
        "bound_mems": format_cpulist(w.bound_mems) if w.bound_mems is not None else None,
        "binding_warning": w.binding_warning,
    }


def build_report(plan: LaunchPlan, result: JobResult) -> dict[str, Any]:
    planned = {r.rank: r for r in plan.ranks}
    last = result.results[-1] if result.results else ()
    ranks = []
    for w in last:
        entry = _rank_entry(w)
        p = planned.get(w.rank)
        if p is not None:
            entry.update(
                gpu_uuid=p.gpu_uuid, pci_bus_id=p.pci_bus_id, numa_node=p.numa_node, planned_cpus=format_cpulist(p.cpus)
            )
        ranks.append(entry)
    return {
        "schema": SCHEMA,
        "run_id": plan.run_id,
        "node": plan.node,
        "world_size": plan.world_size,
        "exit_code": result.exit_code,
        "attempts": result.attempts,
        "signal_received": signal_name(result.signal_received) if result.signal_received else None,
        "root_cause": _rank_entry(result.root_cause) if result.root_cause else None,
        "unkillable_pids": list(result.unkillable),
        "ranks": ranks,
    }


def write_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    """Atomic: the file is either the old one or the whole new one."""
    write_atomic(path, json.dumps(report, indent=2) + "\n")


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise OpenclawError(f"cannot read report {path}: {e}") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise OpenclawError(f"{path} is not an openclaw-launch report (expected schema {SCHEMA!r})")
    return data


def format_report(report: dict[str, Any]) -> str:
    """One line per rank: how it ended, its wall/CPU time, peak RSS and the CPUs it was really on."""
    head = f"{'rank':>4} {'node':<12} {'exit':>8} {'wall_s':>8} {'cpu_s':>8} {'rss_MiB':>8}  bound cpus / mems"
    lines = [
        f"run {report['run_id']} on {report['node']}: exit {report['exit_code']}, {report['attempts']} attempt(s)",
        head,
    ]
    for r in report["ranks"]:
        ended = r["signal"] or (str(r["exit_code"]) if r["exit_code"] is not None else "?")
        rss = f"{r['max_rss_kib'] / 1024:.0f}" if r["max_rss_kib"] else "-"
        cpu = f"{r['cpu_s']:.2f}" if r["cpu_s"] is not None else "-"
        wall = f"{r['wall_s']:.2f}" if r["wall_s"] is not None else "-"
        lines.append(
            f"{r['rank']:>4} {r['node']:<12} {ended:>8} {wall:>8} {cpu:>8} {rss:>8}  "
            f"{r['bound_cpus'] or '?'} / {r['bound_mems'] or '?'}"
        )
        if r.get("binding_warning"):
            lines.append(f"     ! {r['binding_warning']}")
    return "\n".join(lines)
