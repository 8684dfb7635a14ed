"""The reports of a run: this node's, built once from the final data, written atomically and
printed on every exit; with agents, the job's, merged on the first node from every node's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from openclaw_launch.run.setup import say

if TYPE_CHECKING:
    from openclaw_launch.agents.fate import Agent
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.report.model import NodeReport, PreflightVerdict
    from openclaw_launch.run.failure_class import Failure
    from openclaw_launch.run.supervise import JobResult, SuperviseOptions
    from openclaw_launch.stats.result import SessionResult


def node_report(
    plan: LaunchPlan,
    result: JobResult,
    statistics: SessionResult | None,
    failures: dict[int, Failure],
    *,
    dropped_lines: int,
    verdict: PreflightVerdict | None,
    agent: Agent | None,
    elastic: bool,
    report_path: str | None,
    options: SuperviseOptions,
) -> NodeReport:
    """This node's report: written to ``report_path`` (a failed write is said; the exit code stands)
    and printed when any worker started."""
    from openclaw_launch.report.build import build_report, write_report  # after the job: start-up time
    from openclaw_launch.report.format import format_report

    code = result.exit_code
    report = build_report(
        agent.plan if agent is not None else plan,  # an elastic job's: its last world's
        result,
        statistics,
        code,
        console_dropped_lines=dropped_lines,
        preflight=verdict,
        failures=failures,
    )
    if agent is not None and elastic:
        from openclaw_launch.agents.elastic_report import with_memberships

        report = with_memberships(report, agent)
    if report_path:
        try:
            write_report(report_path, report)
        except OSError as e:  # the job's outcome stands: its exit code is not the report's
            say(options, unwritten("report", report_path, e, code))
    if result.attempts:  # per-rank outcome, time, resources and binding in force, on every exit
        say(options, format_report(report))
    return report


def job_report(
    agent: Agent,
    job_report_path: str | None,
    report: NodeReport,
    statistics: SessionResult | None,
    code: int,
    options: SuperviseOptions,
) -> None:
    """Every node sends its report to the first node, which prints and writes the job's."""
    from openclaw_launch.agents.merge import NodePayload, merge_reports, node_payload
    from openclaw_launch.codec import ReportShapeError, from_json, to_json
    from openclaw_launch.report.build import write_report
    from openclaw_launch.report.format import format_report

    own = node_payload(report, statistics, agent.plan)
    sent = agent.finish(to_json(own))
    if sent is None:
        return
    payloads = [own]  # this node's own, as built: the job report never lacks the first node
    for data in sent[1:]:
        try:
            payloads.append(from_json(NodePayload, data))
        except ReportShapeError as e:  # another version of openclaw-launch: that node counts as missing
            say(options, f"openclaw-launch: warning: a node's report could not be read: {e}")
    fates = {attempt: fate.node for attempt, fate in agent.fates.items()}
    job = merge_reports(payloads, agent.opt.nodes, code, fates)  # elastic: the last world's
    if job.missing_nodes:
        say(options, f"openclaw-launch: warning: no report from node(s) {', '.join(job.missing_nodes)}")
    say(options, "job report (every node):\n" + format_report(job))
    if job_report_path:
        try:
            write_report(job_report_path, job)
        except OSError as e:
            say(options, unwritten("job report", job_report_path, e, code))


def unwritten(what: str, path: str, error: OSError, code: int) -> str:
    return (
        f"openclaw-launch: error: cannot write the {what} {path}: {error.strerror or error}; "
        f"the job's exit code {code} stands"
    )
