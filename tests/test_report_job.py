"""The job report (several nodes), merged from the nodes' typed reports: every key a node's report
has, aggregated as docs/report-format.md says; the straggler judged over every node's ranks."""

from __future__ import annotations

import dataclasses
import json

from openclaw_launch.agents.merge import NodePayload, merge_reports, node_payload
from openclaw_launch.codec import from_json, to_json
from openclaw_launch.report.build import CONTAINMENT
from openclaw_launch.report.model import JobReport, NodeReport, Report
from openclaw_launch.stats.collect import PhaseSummary, RankSummary
from openclaw_launch.stats.result import SessionResult
from openclaw_launch.stats.verdict import run_statistics
from tests.report_samples import HANG, node_report


def _summary(rank: int, step_s: float, work_s: float) -> RankSummary:
    wait = step_s - work_s
    return RankSummary(
        rank=rank,
        steps=20,
        measured_steps=17,
        step_p50_s=step_s,
        step_p90_s=step_s,
        step_p99_s=step_s,
        step_max_s=step_s,
        step_mean_s=step_s,
        phases={
            "compute": PhaseSummary(work_s, work_s, work_s, work_s / step_s),
            "sync": PhaseSummary(wait, wait, wait, wait / step_s),
        },
        sync_phases=("sync",),
        gpu_sync_s=None,
        gpu_late_s=None,
        step_source="api",
        dropped_batches=0,
    )


def _session(*summaries: RankSummary) -> SessionResult:
    """What a node's statistics session hands its report and the first node."""
    statistics = run_statistics(summaries, 5.0, None, None, {})
    return SessionResult(statistics=statistics, stragglers=(), hang=None, summaries=summaries, gpus={})


def _sent(payload: NodePayload) -> NodePayload:
    """Through the store as the agents send it: JSON text, read back with the codec."""
    return from_json(NodePayload, json.loads(json.dumps(to_json(payload))))


def test_job_report_judges_stragglers_over_every_node_and_names_node_and_rank() -> None:
    a = node_payload(node_report("a", (0, 1)), _session(_summary(0, 0.1, 0.05), _summary(1, 0.1, 0.05)))
    b = node_payload(node_report("b", (2,)), _session(_summary(2, 0.1, 0.095)))
    job = merge_reports([_sent(a), _sent(b)], ["a", "b", "c"], 0, {0: "a"})
    assert job.scope == "job" and [r.rank for r in job.ranks] == [0, 1, 2]
    assert [n.node for n in job.nodes] == ["a", "b"] and job.missing_nodes == ("c",)
    assert [(s.node, s.rank) for s in job.stragglers] == [("b", 2)]
    statistics = job.ranks[0].statistics
    assert statistics is not None and statistics.wait_share > 0.4  # rank 0 waited for rank 2 on node b


def test_job_report_holds_every_key_of_a_node_report_aggregated() -> None:
    a = node_report(
        "a",
        (0, 1),
        log_errors=("rank 0: log full",),
        console_dropped_lines=3,
        containment="cgroup2:/x+process-groups+subreaper+guardian",
        unkillable_pids=(77,),
    )
    b = node_report("b", (2, 3), console_dropped_lines=4, guardian_lost="guardian pid 9 killed by signal 9", hang=HANG)
    job = merge_reports([_sent(node_payload(a, None)), _sent(node_payload(b, None))], ["a", "b"], 124, {0: "b", 1: "b"})
    node_keys = {f.name for f in dataclasses.fields(NodeReport)}
    assert node_keys <= set(to_json(job)) == {f.name for f in dataclasses.fields(JobReport)}
    assert {f.name for f in dataclasses.fields(Report)} >= {
        "attempt_history",
        "console_dropped_lines",
        "guardian_lost",
        "hang",
        "log_errors",
    }
    assert job.exit_code == 124 and job.attempts == 2
    assert job.log_errors == ("a: rank 0: log full",) and job.console_dropped_lines == 7
    assert job.guardian_lost == "b: guardian pid 9 killed by signal 9"
    assert job.containment == {"a": "cgroup2:/x+process-groups+subreaper+guardian", "b": CONTAINMENT}
    assert job.hang == HANG and job.preflight == {} and job.unkillable_pids == ("a:77",)
    first, second = job.attempt_history
    assert [(r.rank, r.node) for r in first.ranks] == [(0, "a"), (1, "a"), (2, "b"), (3, "b")]
    assert first.root_cause is not None and (first.root_cause.node, first.root_cause.rank) == ("b", 2)
    assert second.root_cause is None and job.root_cause is None
    assert from_json(JobReport, json.loads(json.dumps(to_json(job)))) == job


def test_a_payload_with_step_windows_reads_back_as_sent() -> None:
    """The windows are (step index, medians) pairs: the codec reads a pair place by place (a
    whole job once lost every node's statistics to 'expected int')."""
    summary = dataclasses.replace(_summary(0, 0.1, 0.05), windows=((0, {"compute": 0.05}), (5, {"compute": 0.06})))
    payload = node_payload(node_report("a", (0,)), _session(summary))
    assert _sent(payload) == payload
