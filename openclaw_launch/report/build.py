"""The run report: per-rank outcome, resources, binding in force, step statistics and the
straggler verdict, as JSON and as a table.

Written atomically (temp file + rename) whatever the job's outcome, so a reader never sees half a
report. Schema ``openclaw-report/2`` (documented in docs/report-format.md);
``openclaw-launch report RUN.json`` renders a saved one.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping
from typing import Any

from openclaw_launch.config.limits import MAX_REPORT_BYTES
from openclaw_launch.errors import OpenclawError
from openclaw_launch.files import write_atomic
from openclaw_launch.plan.build import LaunchPlan
from openclaw_launch.report import schema as report_schema
from openclaw_launch.run.supervise import JobResult, WorkerResult, signal_name
from openclaw_launch.safe_read import InputFileError, read_input
from openclaw_launch.stats.collect import RankSummary
from openclaw_launch.stats.verdict import Straggler, format_verdict, wait_source, waited_for_others
from openclaw_launch.telemetry.wire import INPUT
from openclaw_launch.topology.cpulist import format_cpulist

SCHEMA = "openclaw-report/2"
# How the job's processes are kept from outliving it without a per-job cgroup; with one (cgroup.py)
# the report says ``cgroup2:<its directory>+`` this.
CONTAINMENT = "process-groups+subreaper+guardian"
_READABLE_SCHEMAS = ("openclaw-report/1", SCHEMA)


def _rank_entry(w: WorkerResult) -> dict[str, Any]:
    return {
        "rank": w.rank,
        "local_rank": w.local_rank,
        "node": w.node,
        "attempt": w.attempt,
        "pid": w.pid,
        "exit_code": w.exit_code,
        "signal": signal_name(w.signal) if w.signal is not None else None,
        "wall_s": _wall_s(w),
        "cpu_s": w.cpu_s,
        "max_rss_kib": w.max_rss_kib,
        "bound_cpus": format_cpulist(w.bound_cpus) if w.bound_cpus is not None else None,
        "bound_mems": format_cpulist(w.bound_mems) if w.bound_mems is not None else None,
        "binding_warning": w.binding_warning,
    }


def _wall_s(w: WorkerResult) -> float | None:
    """Run time on the monotonic clock (the wall clock may step while the job runs)."""
    if w.wall_s is not None:
        return round(w.wall_s, 3)
    return round(w.end_s - w.start_s, 3) if w.end_s is not None else None


def _attempt_entry(n: int, results: tuple[WorkerResult, ...], root: WorkerResult | None) -> dict[str, Any]:
    return {
        "attempt": n,
        "root_cause": _rank_entry(root) if root is not None else None,
        "ranks": [_rank_entry(w) for w in results],
    }


def _statistics_entry(summary: RankSummary, waited_s: float) -> dict[str, Any]:
    """One rank's step statistics (per step, seconds; shares of the mean step)."""
    sync = set(summary.sync_phases)
    input_share = summary.phases[INPUT].share if INPUT in summary.phases else 0.0
    wait_share = waited_s / summary.step_mean_s if summary.step_mean_s else 0.0
    return {
        "steps": summary.steps,
        "measured_steps": summary.measured_steps,
        "step_source": summary.step_source,
        "step_time_s": {
            "p50": _r(summary.step_p50_s),
            "p90": _r(summary.step_p90_s),
            "p99": _r(summary.step_p99_s),
            "max": _r(summary.step_max_s),
            "mean": _r(summary.step_mean_s),
        },
        "sections": {
            name: {"p50": _r(p.p50_s), "p90": _r(p.p90_s), "mean": _r(p.mean_s), "share": round(p.share, 4)}
            for name, p in summary.phases.items()
        },
        "sync_sections": sorted(sync),
        "input_wait_share": round(input_share, 4),
        "wait_share": round(min(wait_share, 1.0), 4),
        "wait_s": _r(waited_s),
        "sync_sections_s": _r(summary.wait_s),
        "gpu_collective_s": _r(summary.gpu_sync_s) if summary.gpu_sync_s is not None else None,
        "gpu_longest_collective_s": _r(summary.gpu_late_s) if summary.gpu_late_s is not None else None,
        "busy_s": _r(summary.step_mean_s - waited_s),
        "dropped_batches": summary.dropped_batches,
    }


def _r(seconds: float) -> float:
    return round(seconds, 6)


def build_report(
    plan: LaunchPlan,
    result: JobResult,
    statistics: Mapping[str, Any] | None = None,
    console_dropped_lines: int = 0,
) -> dict[str, Any]:
    planned = {r.rank: r for r in plan.ranks}
    last = result.results[-1] if result.results else ()
    stats = statistics or {}
    by_rank = {s.rank: s for s in stats.get("summaries", ())}
    waited = waited_for_others(list(by_rank.values()))
    gpus: Mapping[str, Any] = stats.get("gpus", {})
    ranks = []
    for w in last:
        entry = _rank_entry(w)
        p = planned.get(w.rank)
        if p is not None:
            entry.update(
                gpu_uuid=p.gpu_uuid, pci_bus_id=p.pci_bus_id, numa_node=p.numa_node, planned_cpus=format_cpulist(p.cpus)
            )
        summary = by_rank.get(w.rank)
        entry["statistics"] = _statistics_entry(summary, waited[w.rank]) if summary is not None else None
        entry["gpu"] = gpus.get(p.gpu_uuid) if p is not None and p.gpu_uuid else None
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
        "attempt_history": [
            _attempt_entry(n, results, result.root_causes[n] if n < len(result.root_causes) else None)
            for n, results in enumerate(result.results)
        ],
        "log_errors": list(result.log_errors),
        "console_dropped_lines": console_dropped_lines,
        "guardian_lost": result.guardian_lost,
        "containment": result.containment or CONTAINMENT,
        "statistics": None
        if statistics is None
        else {
            "threshold_pct": stats.get("threshold_pct"),
            "wait_source": wait_source(stats.get("summaries", ())),
            "sync_bound_share": stats.get("sync_bound_share"),
            "gpu_error": stats.get("gpu_error"),
            "bad_datagrams": stats.get("bad_datagrams", 0),
        },
        "stragglers": [s.to_json() for s in stats.get("stragglers", ())],
        "hang": stats.get("hang"),  # --hang-timeout-s fired (openclaw_launch/stats/hang.py); else null
        "preflight": None,  # `openclaw-launch preflight` fills it (docs/preflight.md)
        "ranks": ranks,
    }


def write_report(path: str | os.PathLike[str], report: dict[str, Any]) -> None:
    """Atomic: the file is either the old one or the whole new one."""
    write_atomic(path, json.dumps(report, indent=2) + "\n")


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(read_input(path, "report", MAX_REPORT_BYTES))
    except InputFileError as e:
        raise OpenclawError(str(e)) from None
    except ValueError as e:
        raise OpenclawError(f"cannot read report {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") not in _READABLE_SCHEMAS:
        raise OpenclawError(f"{path} is not an openclaw-launch report (expected schema {SCHEMA!r})")
    try:
        report_schema.check(data, report_schema.REPORT)
    except report_schema.ReportShapeError as e:
        raise OpenclawError(f"{path}: not a well-formed report: {e}; re-create it with run --report") from None
    return data


def format_report(report: dict[str, Any]) -> str:
    """One line per rank: how it ended, wall/CPU time, peak RSS, step time and where the step went,
    the CPUs it was really on; then the straggler verdict."""
    head = (
        f"{'rank':>4} {'node':<12} {'exit':>8} {'wall_s':>8} {'cpu_s':>8} {'rss_MiB':>8} {'steps':>6} "
        f"{'p50_ms':>7} {'p90_ms':>7} {'input':>6} {'work':>6} {'wait':>6}  bound cpus / mems"
    )
    where = report["node"]
    if report.get("scope") == "job":
        where = f"{len(report['nodes'])} nodes ({', '.join(n['node'] for n in report['nodes'])})"
    lines = [f"run {report['run_id']} on {where}: exit {report['exit_code']}, {report['attempts']} attempt(s)", head]
    if report.get("missing_nodes"):
        lines.insert(1, f"no report from node(s): {', '.join(report['missing_nodes'])}")
    for r in report["ranks"]:
        ended = r["signal"] or (str(r["exit_code"]) if r["exit_code"] is not None else "?")
        rss = f"{r['max_rss_kib'] / 1024:.0f}" if r["max_rss_kib"] else "-"
        cpu = f"{r['cpu_s']:.2f}" if r["cpu_s"] is not None else "-"
        wall = f"{r['wall_s']:.2f}" if r["wall_s"] is not None else "-"
        steps = _step_columns(r.get("statistics"))
        lines.append(
            f"{r['rank']:>4} {r['node']:<12} {ended:>8} {wall:>8} {cpu:>8} {rss:>8} {steps}  "
            f"{r['bound_cpus'] or '?'} / {r['bound_mems'] or '?'}"
        )
        if r.get("binding_warning"):
            lines.append(f"     ! {r['binding_warning']}")
    lines += _verdict_lines(report)
    return "\n".join(lines)


def _step_columns(stats: Mapping[str, Any] | None) -> str:
    if not stats or not stats.get("measured_steps"):
        steps = stats["steps"] if stats else "-"
        return f"{steps:>6} {'-':>7} {'-':>7} {'-':>6} {'-':>6} {'-':>6}"
    step = stats["step_time_s"]
    input_share, wait_share = stats["input_wait_share"], stats["wait_share"]
    work_share = max(1.0 - input_share - wait_share, 0.0)
    return (
        f"{stats['steps']:>6} {1000 * step['p50']:>7.1f} {1000 * step['p90']:>7.1f} "
        f"{100 * input_share:>5.0f}% {100 * work_share:>5.0f}% {100 * wait_share:>5.0f}%"
    )


def _hang_lines(report: Mapping[str, Any]) -> list[str]:
    hang = report.get("hang")
    if not isinstance(hang, dict):
        return []
    stuck = [r for r in hang.get("ranks", ()) if isinstance(r, dict) and r.get("stuck")]
    what = ", ".join(
        f"rank {r.get('rank')} in {r.get('collective') if r.get('phase') == 'collective' else r.get('phase')}"
        for r in stuck
    )
    return [f"hang: no step for {hang.get('timeout_s')} s; stuck: {what or '?'} (exit code {hang.get('exit_code')})"]


def _verdict_lines(report: Mapping[str, Any]) -> list[str]:
    stats = report.get("statistics")
    if stats is None:
        return _hang_lines(report)
    hang = _hang_lines(report)
    if hang:
        return hang + _verdict_lines({**report, "hang": None})
    measured = [r["statistics"] for r in report["ranks"] if r.get("statistics") and r["statistics"]["measured_steps"]]
    if not measured:
        return ["statistics: no steps seen (telemetry.step(), or torch with an optimizer or DataLoader, gives them)"]
    median_step = statistics.median(s["step_time_s"]["mean"] for s in measured)
    lines = [format_verdict(Straggler.from_json(s), median_step) for s in report.get("stragglers", ())]
    if not lines:
        lines.append(f"straggler: none (no rank busy {stats['threshold_pct']:g} % of the step longer than the others)")
        if stats.get("wait_source") != "nccl-flight-recorder" and any(r.get("gpu_uuid") for r in report["ranks"]):
            lines.append(
                "  note: GPU ranks without NCCL's flight recorder: a rank slow in its input stage is named, one "
                "slow in GPU work is not (run with --telemetry full)"
            )
    if stats.get("sync_bound_share"):
        lines.append(
            f"synchronisation: every rank waits at least {100 * stats['sync_bound_share']:.0f} % of its step for the "
            "others: the collectives themselves are slow (network, topology, NCCL settings), not one rank"
        )
    if stats.get("gpu_error"):
        lines.append(f"gpu: {stats['gpu_error']}")
    return lines
