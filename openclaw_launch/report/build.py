"""A node's run report, built once from the job's final data; writing and reading report files.

Written atomically (temp file + rename) whatever the job's outcome, so a reader never sees half a
report. ``openclaw-launch report RUN.json`` reads one back (``load_report``), checked field by field
against the types (report/model.py) before anything renders it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from openclaw_launch.codec import ReportShapeError, from_json, to_json
from openclaw_launch.errors import OpenclawError
from openclaw_launch.files import write_atomic
from openclaw_launch.limits import MAX_REPORT_BYTES
from openclaw_launch.report.failure import AttemptFailure
from openclaw_launch.report.model import JOB_SCOPE, READ_SCHEMAS, SCHEMA, AttemptEntry, JobReport, NodeReport
from openclaw_launch.report.preflight import PreflightVerdict
from openclaw_launch.report.rank import RankEntry, RankOutcome, SectionTimes, StepStatistics, StepTimes
from openclaw_launch.run.failure_class import Failure
from openclaw_launch.run.results import JobResult, WorkerResult, signal_name
from openclaw_launch.safe_read import InputFileError, parse_json, read_input
from openclaw_launch.stats.collect import RankSummary
from openclaw_launch.stats.memory import find_asymmetry
from openclaw_launch.stats.phases import split as phase_split
from openclaw_launch.stats.result import SessionResult, Straggler
from openclaw_launch.stats.verdict import waited_for_others
from openclaw_launch.topology.cpulist import format_cpulist

if TYPE_CHECKING:
    from openclaw_launch.plan.model import LaunchPlan

# How the job's processes are kept from outliving it without a per-job cgroup; with one (cgroup.py)
# the report says ``cgroup2:<its directory>+`` this.
CONTAINMENT = "process-groups+subreaper+guardian"


def rank_outcome(w: WorkerResult) -> RankOutcome:
    return RankOutcome(
        rank=w.rank,
        local_rank=w.local_rank,
        node=w.node,
        attempt=w.attempt,
        pid=w.pid,
        exit_code=w.exit_code,
        signal=signal_name(w.signal) if w.signal is not None else None,
        wall_s=_wall_s(w),
        cpu_s=w.cpu_s,
        max_rss_kib=w.max_rss_kib,
        bound_cpus=format_cpulist(w.bound_cpus) if w.bound_cpus is not None else None,
        bound_mems=format_cpulist(w.bound_mems) if w.bound_mems is not None else None,
        binding_warning=w.binding_warning,
    )


def _wall_s(w: WorkerResult) -> float | None:
    """Run time on the monotonic clock (the wall clock may step while the job runs)."""
    if w.wall_s is not None:
        return round(w.wall_s, 3)
    return round(w.end_s - w.start_s, 3) if w.end_s is not None else None


def statistics_entry(summary: RankSummary, waited_s: float) -> StepStatistics:
    """One rank's step statistics (per step, seconds; shares of the mean step, as stats/phases.py
    splits it)."""
    input_share, _, wait_share = phase_split(
        summary.step_mean_s, {name: p.mean_s for name, p in summary.phases.items()}, waited_s
    ).shares()
    return StepStatistics(
        steps=summary.steps,
        measured_steps=summary.measured_steps,
        step_source=summary.step_source,
        step_time_s=StepTimes(
            p50=_r(summary.step_p50_s),
            p90=_r(summary.step_p90_s),
            p99=_r(summary.step_p99_s),
            max=_r(summary.step_max_s),
            mean=_r(summary.step_mean_s),
        ),
        sections={
            name: SectionTimes(p50=_r(p.p50_s), p90=_r(p.p90_s), mean=_r(p.mean_s), share=round(p.share, 4))
            for name, p in summary.phases.items()
        },
        sync_sections=tuple(sorted(set(summary.sync_phases))),
        input_wait_share=round(input_share, 4),
        wait_share=round(min(wait_share, 1.0), 4),
        wait_s=_r(waited_s),
        sync_sections_s=_r(summary.wait_s),
        gpu_collective_s=_r(summary.gpu_sync_s) if summary.gpu_sync_s is not None else None,
        gpu_longest_collective_s=_r(summary.gpu_late_s) if summary.gpu_late_s is not None else None,
        busy_s=_r(summary.step_mean_s - waited_s),
        dropped_batches=summary.dropped_batches,
    )


def _r(seconds: float) -> float:
    return round(seconds, 6)


def straggler_entry(s: Straggler) -> Straggler:
    """A straggler as the report holds it: its times to the microsecond, its share to 0.1 %."""
    return replace(
        s,
        excess_s=_r(s.excess_s),
        excess_pct=round(s.excess_pct, 1),
        busy_s=_r(s.busy_s),
        peers_busy_s=_r(s.peers_busy_s),
        peers_wait_s=_r(s.peers_wait_s),
        pct_of_s=_r(s.pct_of_s) if s.pct_of_s is not None else None,
    )


def build_report(
    plan: LaunchPlan,
    result: JobResult,
    statistics: SessionResult | None,
    exit_code: int,
    console_dropped_lines: int = 0,
    preflight: PreflightVerdict | None = None,
    failures: Mapping[int, Failure] | None = None,
) -> NodeReport:
    """The node's report. ``statistics``: what the statistics session found (``StatsSession.finish``),
    None with telemetry off; ``exit_code``: the launcher's, decided before (several nodes: the job's);
    ``preflight``: the verdict of ``openclaw-launch preflight``; ``failures``: each attempt's
    classified failure (run/failure_policy.py)."""
    planned = {r.rank: r for r in plan.ranks}
    last = result.results[-1] if result.results else ()
    summaries = statistics.summaries if statistics is not None else ()
    by_rank = {s.rank: s for s in summaries}
    waited = waited_for_others(summaries)
    gpus = statistics.gpus if statistics is not None else {}
    ranks = []
    for w in last:
        p = planned.get(w.rank)
        summary = by_rank.get(w.rank)
        gpu = gpus.get(p.gpu_uuid) if p is not None and p.gpu_uuid else None
        ranks.append(
            RankEntry(
                **vars(rank_outcome(w)),
                gpu_uuid=p.gpu_uuid if p is not None else None,
                pci_bus_id=p.pci_bus_id if p is not None else None,
                numa_node=p.numa_node if p is not None else None,
                planned_cpus=format_cpulist(p.cpus) if p is not None else None,
                statistics=statistics_entry(summary, waited[w.rank]) if summary is not None else None,
                gpu=gpu,
                nic=p.nic if p is not None else None,
            )
        )
    return NodeReport(
        schema=SCHEMA,
        run_id=plan.run_id,
        node=plan.node,
        world_size=plan.world_size,
        master_port=plan.master_port,
        exit_code=exit_code,
        attempts=result.attempts,
        signal_received=signal_name(result.signal_received) if result.signal_received else None,
        root_cause=rank_outcome(result.root_cause) if result.root_cause else None,
        attempt_history=tuple(
            AttemptEntry(
                attempt=n,
                root_cause=rank_outcome(cause) if (cause := _root_cause(result, n)) is not None else None,
                ranks=tuple(rank_outcome(w) for w in results),
                failure=attempt_failure(f) if (f := (failures or {}).get(n)) is not None else None,
            )
            for n, results in enumerate(result.results)
        ),
        log_errors=tuple(result.log_errors),
        console_dropped_lines=console_dropped_lines,
        guardian_lost=result.guardian_lost,
        statistics=statistics.statistics if statistics is not None else None,
        stragglers=tuple(straggler_entry(s) for s in statistics.stragglers) if statistics is not None else (),
        hang=statistics.hang if statistics is not None else None,
        ranks=tuple(ranks),
        unkillable_pids=tuple(result.unkillable),
        containment=result.containment or CONTAINMENT,
        preflight=preflight,
        step_imbalance=statistics.imbalance if statistics is not None else None,
        memory_asymmetry=find_asymmetry(plan.ranks, plan.parallel, gpus),
    )


def attempt_failure(f: Failure) -> AttemptFailure:
    return AttemptFailure(f.name, f.restart_helps, f.detail, f.rank, f.node, f.storm)


def _root_cause(result: JobResult, attempt: int) -> WorkerResult | None:
    return result.root_causes[attempt] if attempt < len(result.root_causes) else None


def write_report(path: str | os.PathLike[str], report: NodeReport | JobReport) -> None:
    """Atomic: the file is either the old one or the whole new one."""
    write_atomic(path, json.dumps(to_json(report), indent=2) + "\n")


def load_report(path: str | os.PathLike[str]) -> NodeReport | JobReport:
    """A saved report (a node's or the job's), checked against its type: a wrong or missing field is
    one error naming it."""
    try:
        data = parse_json(read_input(path, "report", MAX_REPORT_BYTES), allow_constants=True)
    except InputFileError as e:
        raise OpenclawError(str(e)) from None
    except ValueError as e:
        raise OpenclawError(f"cannot read report {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("schema") not in READ_SCHEMAS:
        raise OpenclawError(f"{path} is not an openclaw-launch report (expected schema {SCHEMA!r})")
    kind: type[NodeReport | JobReport] = JobReport if data.get("scope") == JOB_SCOPE else NodeReport
    try:
        return from_json(kind, data, schema=READ_SCHEMAS[data["schema"]])
    except ReportShapeError as e:
        raise OpenclawError(f"{path}: not a well-formed report: {e}; re-create it with run --report") from None
