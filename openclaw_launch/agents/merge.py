"""The job report: every node's report and statistics, merged on the first node. Pure.

Built from the nodes' typed reports (report/model.py): the ranks of every node in rank order, each
attempt with every node's ranks, the straggler verdict judged over all ranks (so it names the node
and rank), and every other key of a node's report aggregated as docs/report-format.md says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from openclaw_launch.report.build import statistics_entry, straggler_entry
from openclaw_launch.report.model import JOB_SCOPE, AttemptEntry, JobReport, NodeReport, NodeSummary
from openclaw_launch.stats import imbalance, memory
from openclaw_launch.stats.collect import RankSummary
from openclaw_launch.stats.result import RunStatistics, SessionResult, StepImbalance, Straggler
from openclaw_launch.stats.verdict import RankFacts, find_stragglers, fixed_only, run_statistics, waited_for_others

if TYPE_CHECKING:
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.report.membership import Exclusion


@dataclass(frozen=True)
class NodePayload:
    """What a node sends the first node: its report, its ranks' raw summaries (to judge stragglers
    job-wide), their last steps (the job's per-step imbalance) and their GPU memory with its role
    (the job's memory asymmetry)."""

    report: NodeReport
    summaries: tuple[RankSummary, ...]
    threshold_pct: float | None
    steps: tuple[imbalance.RankSteps, ...]
    memory: tuple[memory.RankMemory, ...]


def node_payload(report: NodeReport, statistics: SessionResult | None, plan: LaunchPlan | None) -> NodePayload:
    """``plan``: the node's (an elastic job's last world's): the ranks' roles for the memory."""
    if statistics is None:
        return NodePayload(report, (), None, (), ())
    held = memory.rank_memory(plan.ranks, plan.parallel, statistics.gpus) if plan is not None else ()
    return NodePayload(report, statistics.summaries, statistics.statistics.threshold_pct, statistics.recent_steps, held)


def merge_reports(
    payloads: Sequence[NodePayload], nodes: Sequence[str], exit_code: int, fate_nodes: Mapping[int, str]
) -> JobReport:
    """``payloads``: the first node's first; ``nodes``: the config's, in order; ``exit_code``: the
    job's; ``fate_nodes``: per attempt, the node whose stop was the job's fate (its root cause is
    the attempt's)."""
    reports = [p.report for p in payloads]
    first = reports[0]
    got = {r.node for r in reports}
    ranks = sorted((r for rep in reports for r in rep.ranks), key=lambda r: r.rank)
    statistics: RunStatistics | None = None
    stragglers: tuple[Straggler, ...] = ()
    step_imbalance: StepImbalance | None = None
    if any(rep.statistics is not None for rep in reports):
        summaries = [s for p in payloads for s in p.summaries]
        threshold = next((p.threshold_pct for p in payloads if p.threshold_pct is not None), None)
        by_rank = {s.rank: s for s in summaries}
        waited = waited_for_others(summaries)
        facts = {r.rank: RankFacts(r.node, r.gpu, r.binding_warning) for r in ranks}
        judged = imbalance.aligned((s for p in payloads for s in p.steps), sorted(by_rank)).judge()
        step_imbalance = StepImbalance.of(judged) if judged is not None else None
        found = find_stragglers(summaries, facts, threshold) if threshold is not None else []
        stragglers = tuple(straggler_entry(s) for s in fixed_only(found, judged, threshold or 0.0))
        ranks = [
            replace(r, statistics=statistics_entry(by_rank[r.rank], waited[r.rank]) if r.rank in by_rank else None)
            for r in ranks
        ]
        node_stats = [rep.statistics for rep in reports if rep.statistics is not None]
        statistics = run_statistics(
            summaries,
            threshold,
            next((s.gpu_error for s in node_stats if s.gpu_error), None),
            next((s.stats_file_error for s in node_stats if s.stats_file_error), None),
            {rank: d for s in node_stats for rank, d in s.dropped_datagrams.items()},  # ranks are per node
        )
    history = _attempts(reports, fate_nodes)
    lost_guardians = [f"{rep.node}: {rep.guardian_lost}" for rep in reports if rep.guardian_lost]
    return JobReport(
        schema=first.schema,
        run_id=first.run_id,
        node=first.node,
        world_size=first.world_size,
        master_port=first.master_port,
        exit_code=exit_code,
        attempts=max(rep.attempts for rep in reports),
        signal_received=next((rep.signal_received for rep in reports if rep.signal_received), None),
        root_cause=history[-1].root_cause if history else None,
        attempt_history=history,
        log_errors=tuple(f"{rep.node}: {text}" for rep in reports for text in rep.log_errors),
        console_dropped_lines=sum(rep.console_dropped_lines for rep in reports),
        guardian_lost="; ".join(lost_guardians) or None,
        statistics=statistics,
        stragglers=stragglers,
        hang=next((rep.hang for rep in reports if rep.hang is not None), None),
        ranks=tuple(ranks),
        exclusions=_each_once(x for rep in reports for x in rep.exclusions),
        scope=JOB_SCOPE,
        nodes=tuple(NodeSummary(rep.node, rep.exit_code, rep.attempts, rep.signal_received) for rep in reports),
        missing_nodes=tuple(n for n in nodes if n not in got),
        unkillable_pids=tuple(f"{rep.node}:{pid}" for rep in reports for pid in rep.unkillable_pids),
        containment={rep.node: rep.containment for rep in reports},
        preflight={rep.node: rep.preflight for rep in reports if rep.preflight is not None},
        step_imbalance=step_imbalance,
        memory_asymmetry=memory.asymmetry([m for p in payloads for m in p.memory]),
    )


def _each_once(exclusions: Iterable[Exclusion]) -> tuple[Exclusion, ...]:
    """Each node taken out once, by (node, world, reason): the first node's record first (only it knows
    a straggler exclusion's step time after, agents/straggler_actions.py)."""
    kept: dict[tuple[str, int, str], Exclusion] = {}
    for x in exclusions:
        kept.setdefault((x.node, x.world, x.reason), x)
    return tuple(kept.values())


def _attempts(reports: Sequence[NodeReport], fate_nodes: Mapping[int, str]) -> tuple[AttemptEntry, ...]:
    """Per attempt, every node's ranks in rank order; the root cause and the failure from the node of
    its fate (a node's own failure over another's `remote` view of it)."""
    by_attempt: dict[int, list[AttemptEntry]] = {}
    for rep in reports:
        for entry in rep.attempt_history:
            by_attempt.setdefault(entry.attempt, []).append(entry)
    out = []
    for attempt, entries in sorted(by_attempt.items()):
        fate_node = fate_nodes.get(attempt)
        root = next(
            (e.root_cause for e in entries if e.root_cause is not None and e.root_cause.node == fate_node), None
        )
        ranks = tuple(sorted((r for e in entries for r in e.ranks), key=lambda r: r.rank))
        failures = [e.failure for e in entries if e.failure is not None and e.failure.failure_class != "remote"]
        failure = next((f for f in failures if f.node == fate_node), failures[0] if failures else None)
        out.append(AttemptEntry(attempt=attempt, root_cause=root, ranks=ranks, failure=failure))
    return tuple(out)
