"""The job report (several nodes), merged from the nodes' typed reports: every key a node's report
has, aggregated as docs/report-format.md says; the straggler judged over every node's ranks."""

from __future__ import annotations

import dataclasses
import json
import random

from openclaw_launch.agents.merge import NodePayload, merge_reports, node_payload
from openclaw_launch.codec import from_json, to_json
from openclaw_launch.report.build import CONTAINMENT
from openclaw_launch.report.format import format_report
from openclaw_launch.report.model import JobReport, NodeReport, Report
from openclaw_launch.stats.collect import PhaseSummary, RankSummary
from openclaw_launch.stats.imbalance import StepAlignment
from openclaw_launch.stats.memory import RankMemory
from openclaw_launch.stats.result import SessionResult
from openclaw_launch.stats.verdict import run_statistics
from openclaw_launch.telemetry import wire
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
    a = node_payload(node_report("a", (0, 1)), _session(_summary(0, 0.1, 0.05), _summary(1, 0.1, 0.05)), None)
    b = node_payload(node_report("b", (2,)), _session(_summary(2, 0.1, 0.095)), None)
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
    job = merge_reports(
        [_sent(node_payload(a, None, None)), _sent(node_payload(b, None, None))], ["a", "b"], 124, {0: "b", 1: "b"}
    )
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
    payload = node_payload(node_report("a", (0,)), _session(summary), None)
    assert _sent(payload) == payload


def _node_steps(ranks: tuple[int, ...], costly: dict[int, int], steps: int) -> SessionResult:
    """A node's session after ``steps`` steps of its ``ranks`` (a 10 ms forward and a sync in a 20 ms
    step; at step n, rank ``costly[n]``'s forward 6 ms longer), sent in batches of 10 as workers do."""
    alignment = StepAlignment(ranks)
    for first in range(0, steps, 10):
        for rank in ranks:
            rows = []
            for n in range(first, first + 10):
                forward = 0.016 if costly[n] == rank else 0.010
                rows.append((0.020, {"forward": forward, "sync": 0.020 - forward}))
            alignment.add(wire.Batch(rank=rank, steps=rows, sync_phases=("sync",)))
    summaries = tuple(_summary(r, 0.02, 0.012) for r in ranks)
    return dataclasses.replace(_session(*summaries), recent_steps=alignment.recent())


def test_job_report_aligns_every_nodes_steps_and_compares_memory_across_nodes() -> None:
    """Three nodes, one rank each: no node sees an imbalance of its own (one rank), the job does; and
    rank 1 on node b holds 4 GiB more than the ranks of the other nodes."""
    draw = random.Random(7)
    costly = {n: draw.randrange(3) for n in range(80)}
    fixed = dict.fromkeys(range(80), 1)  # the control: the same rank always costly
    reports = [node_report(name, (rank,)) for rank, name in enumerate("abc")]

    def job(costs: dict[int, int]) -> JobReport:
        payloads = []
        for rank, report in enumerate(reports):
            payload = node_payload(report, _node_steps((rank,), costs, 80), None)
            gib = 24.0 if rank == 1 else 20.0
            payloads.append(dataclasses.replace(payload, memory=(RankMemory(rank, report.node, "all", 1024 * gib),)))
        return merge_reports([_sent(p) for p in payloads], ["a", "b", "c"], 0, {})

    moving = job(costly)
    assert moving.step_imbalance is not None and moving.step_imbalance.variance
    assert moving.step_imbalance.steps == 80 - 3 and 28 < moving.step_imbalance.cost_pct < 32  # 6 of 20 ms
    assert [(m.rank, m.node, m.excess_gib) for m in moving.memory_asymmetry] == [(1, "b", 4.0)]
    text = format_report(moving)
    assert "per-step imbalance: no fixed straggler" in text and "memory: rank 1 on node b holds 4.0 GiB more" in text
    assert from_json(JobReport, json.loads(json.dumps(to_json(moving)))) == moving
    control = job(fixed)
    assert control.step_imbalance is not None and not control.step_imbalance.variance
    assert control.step_imbalance.slowest_share == {"0": 0.0, "1": 1.0, "2": 0.0}
