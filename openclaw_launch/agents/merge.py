"""The job report: every node's report and statistics, merged on the first node. Pure.

Same schema as a node's report (``openclaw-report/2``) with ``scope: "job"`` and a ``nodes``
list; the ranks of every node in rank order, and the straggler verdict judged over all ranks
(so it names the node and rank). See docs/report-format.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from openclaw_launch.report.build import _statistics_entry
from openclaw_launch.stats.collect import PhaseSummary, RankSummary
from openclaw_launch.stats.verdict import RankFacts, find_stragglers, sync_bound, wait_source, waited_for_others


def node_payload(report: Mapping[str, Any], statistics: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a node sends: its report, and its ranks' raw summaries (to judge stragglers job-wide)."""
    stats = statistics or {}
    return {
        "report": dict(report),
        "summaries": [asdict(s) for s in stats.get("summaries", ())],
        "threshold_pct": stats.get("threshold_pct"),
    }


def _summary(data: Mapping[str, Any]) -> RankSummary:
    fields = dict(data)
    fields["phases"] = {k: PhaseSummary(**v) for k, v in data["phases"].items()}
    fields["sync_phases"] = tuple(data["sync_phases"])
    return RankSummary(**fields)


def merge_reports(
    payloads: Sequence[Mapping[str, Any]], nodes: Sequence[str], exit_code: int, root_node: str | None
) -> dict[str, Any]:
    reports = [p["report"] for p in payloads]
    first = reports[0]
    got = {r["node"] for r in reports}
    ranks = sorted((dict(r) for rep in reports for r in rep["ranks"]), key=lambda r: r["rank"])
    summaries = [_summary(s) for p in payloads for s in p.get("summaries", ())]
    has_stats = any(rep.get("statistics") is not None for rep in reports)
    threshold = next((p["threshold_pct"] for p in payloads if p.get("threshold_pct") is not None), None)
    stragglers: list[dict[str, object]] = []
    statistics = None
    if has_stats:
        by_rank = {s.rank: s for s in summaries}
        waited = waited_for_others(summaries)
        facts = {
            r["rank"]: RankFacts(node=r["node"], gpu=r.get("gpu"), binding_warning=r.get("binding_warning"))
            for r in ranks
        }
        found = find_stragglers(summaries, facts, threshold) if threshold is not None else []
        stragglers = [s.to_json() for s in found]
        for r in ranks:
            summary = by_rank.get(r["rank"])
            r["statistics"] = _statistics_entry(summary, waited[r["rank"]]) if summary is not None else None
        node_stats = [rep["statistics"] for rep in reports if rep.get("statistics")]
        statistics = {
            "threshold_pct": threshold,
            "wait_source": wait_source(summaries),
            "sync_bound_share": sync_bound(summaries),
            "gpu_error": next((s.get("gpu_error") for s in node_stats if s.get("gpu_error")), None),
            "bad_datagrams": sum(s.get("bad_datagrams") or 0 for s in node_stats),
        }
    root = next((rep["root_cause"] for rep in reports if rep["node"] == root_node and rep.get("root_cause")), None)
    return {
        "schema": first["schema"],
        "scope": "job",
        "run_id": first["run_id"],
        "node": first["node"],
        "nodes": [
            {
                "node": rep["node"],
                "exit_code": rep["exit_code"],
                "attempts": rep["attempts"],
                "signal_received": rep["signal_received"],
            }
            for rep in reports
        ],
        "missing_nodes": [n for n in nodes if n not in got],
        "world_size": first["world_size"],
        "exit_code": exit_code,
        "attempts": max(rep["attempts"] for rep in reports),
        "signal_received": next((rep["signal_received"] for rep in reports if rep["signal_received"]), None),
        "root_cause": root,
        "unkillable_pids": [f"{rep['node']}:{pid}" for rep in reports for pid in rep["unkillable_pids"]],
        "statistics": statistics,
        "stragglers": stragglers,
        "ranks": ranks,
    }
