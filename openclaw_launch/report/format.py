"""The report as a table: one line per rank, then the hang and the straggler verdict."""

from __future__ import annotations

import statistics

from openclaw_launch.report.model import JobReport, NodeReport, Report
from openclaw_launch.report.rank import StepStatistics
from openclaw_launch.run.failure_class import BY_NAME, CAN_HELP, CANNOT_HELP
from openclaw_launch.stats.collect import OTHER, WARMUP_STEPS
from openclaw_launch.stats.groups import waits_text
from openclaw_launch.stats.judged import PCT_OF_OWN_WORK
from openclaw_launch.stats.phases import GPU_WORK, StepSplit, split
from openclaw_launch.stats.result import StepImbalance, Straggler
from openclaw_launch.telemetry.wire import HOST, INPUT

_SECTION_WORDS = {
    OTHER: "outside the hooked phases: the loop's own code",
    GPU_WORK: "its GPU work: not in its input stage",
    INPUT: "the DataLoader",
    HOST: "before the forward: batches, copies, logging in the loop",
}


def step_split(stats: StepStatistics) -> StepSplit:
    """A rank's mean step as input / work / wait, as the table, the plot and the verdict count it."""
    return split(stats.step_time_s.mean, {name: sec.mean for name, sec in stats.sections.items()}, stats.wait_s)


def format_report(report: NodeReport | JobReport) -> str:
    """One line per rank: how it ended, wall/CPU time, peak RSS, step time and where the step went,
    the CPUs it was really on; then the straggler verdict."""
    head = (
        f"{'rank':>4} {'node':<12} {'exit':>8} {'wall_s':>8} {'cpu_s':>8} {'rss_MiB':>8} {'steps':>6} "
        f"{'p50_ms':>7} {'p90_ms':>7} {'input':>6} {'work':>6} {'wait':>6}  bound cpus / mems"
    )
    where = report.node
    if isinstance(report, JobReport):
        where = f"{len(report.nodes)} nodes ({', '.join(n.node for n in report.nodes)})"
    lines = [f"run {report.run_id} on {where}: exit {report.exit_code}, {report.attempts} attempt(s)", head]
    if isinstance(report, JobReport) and report.missing_nodes:
        lines.insert(1, f"no report from node(s): {', '.join(report.missing_nodes)}")
    for r in report.ranks:
        ended = r.signal or (str(r.exit_code) if r.exit_code is not None else "?")
        rss = f"{r.max_rss_kib / 1024:.0f}" if r.max_rss_kib else "-"
        cpu = f"{r.cpu_s:.2f}" if r.cpu_s is not None else "-"
        wall = f"{r.wall_s:.2f}" if r.wall_s is not None else "-"
        lines.append(
            f"{r.rank:>4} {r.node:<12} {ended:>8} {wall:>8} {cpu:>8} {rss:>8} {_step_columns(r.statistics)}  "
            f"{r.bound_cpus or '?'} / {r.bound_mems or '?'}"
        )
        if r.binding_warning:
            lines.append(f"     ! {r.binding_warning}")
    exclusions = [f"exclusion: {x.line}" for x in report.exclusions]
    return "\n".join(lines + _failure_lines(report) + exclusions + _hang_lines(report) + _verdict_lines(report))


def format_verdict(s: Straggler, median_step_s: float) -> str:
    """The exit summary's straggler line: its excess as a share of what the verdict compared it with
    (``pct_of``: the step, ``median_step_s`` in a report without ``pct_of_s``; a pipeline stage's own work)."""
    words = _SECTION_WORDS.get(s.section, s.section)
    where = f"its input/host stage ({words})" if s.phase == INPUT else f"compute ({words})"
    compared_ms = 1000 * (s.pct_of_s if s.pct_of_s is not None else median_step_s)
    of = f"the {compared_ms:.1f} ms step"
    if s.pct_of == PCT_OF_OWN_WORK:
        of = f"its own work, {compared_ms:.1f} ms/step: its step less its waits for the other stages"
    text = (
        f"straggler: rank {s.rank} on node {s.node}: {where} +{1000 * s.excess_s:.1f} ms/step "
        f"(+{s.excess_pct:.0f} % of {of}) over the median rank"
    )
    if s.peers_wait_s > 0:
        text += f"; the other ranks waited {1000 * s.peers_wait_s:.1f} ms/step longer in synchronisation"
    if s.wait_source == "nccl-flight-recorder":
        text += " (NCCL flight recorder)"
    return "\n".join([text, *(f"  hint: {h}" for h in s.hints)])


def format_imbalance(imb: StepImbalance, shown_ranks: int = 4) -> str:
    """The finding: the slowest rank moves from step to step, what it costs, what to do."""
    shares = sorted(imb.slowest_share.items(), key=lambda kv: (-kv[1], int(kv[0])))
    who = ", ".join(f"rank {rank} in {100 * share:.0f} %" for rank, share in shares[:shown_ranks])
    if len(shares) > shown_ranks:
        who += f", {len(shares) - shown_ranks} more"
    text = (
        f"per-step imbalance: no fixed straggler, the slowest rank changes from step to step (slowest: {who} "
        f"of {imb.steps} steps); the spread costs {1000 * imb.cost_s:.1f} ms/step ({imb.cost_pct:.0f} % of the "
        f"{1000 * imb.step_s:.1f} ms step): every step waits for its slowest rank"
    )
    return "\n".join([text, *(f"  hint: {h}" for h in imb.hints)])


def _step_columns(stats: StepStatistics | None) -> str:
    if stats is None or not stats.measured_steps:
        steps = stats.steps if stats is not None else "-"
        return f"{steps:>6} {'-':>7} {'-':>7} {'-':>6} {'-':>6} {'-':>6}"
    step = stats.step_time_s
    input_share, work_share, wait_share = step_split(stats).shares()
    return (
        f"{stats.steps:>6} {1000 * step.p50:>7.1f} {1000 * step.p90:>7.1f} "
        f"{100 * input_share:>5.0f}% {100 * work_share:>5.0f}% {100 * wait_share:>5.0f}%"
    )


def _failure_lines(report: Report) -> list[str]:
    """Per failed attempt: its failure class and evidence, what a restart can do for it and what was done
    (docs/failures.md)."""
    lines = []
    last = len(report.attempt_history) - 1
    for n, entry in enumerate(report.attempt_history):
        f = entry.failure
        if f is None:
            continue
        whose = f"rank {f.rank} on node {f.node}" if f.rank is not None else f"node {f.node}"
        known = BY_NAME.get(f.failure_class)  # the class's words: it can, may or cannot help
        restart = known.restart if known is not None else CAN_HELP if f.restart_helps else CANNOT_HELP
        done = ""  # what was done, as run/failure_policy.py decided it
        if n < last:
            done = "; restarted, as --restart-any-class asks" if restart == CANNOT_HELP else "; restarted"
        elif f.storm:
            done = "; restart storm: as the attempt before, before the first step: no restart"
        elif restart == CANNOT_HELP:
            done = "; not restarted"
        lines.append(
            f"attempt {entry.attempt + 1}: failure class {f.failure_class} ({f.detail}), {whose}: "
            f"a restart {restart}{done}"
        )
    return lines


def _hang_lines(report: Report) -> list[str]:
    hang = report.hang
    if hang is None:
        return []
    what = ", ".join(
        f"rank {r.rank} in {r.collective if r.phase == 'collective' else r.phase}" for r in hang.ranks if r.stuck
    )
    limit = f"no first step within {hang.startup_timeout_s} s" if hang.startup else f"no step for {hang.timeout_s} s"
    lines = [f"hang: {limit}; stuck: {what or '?'} (exit code {hang.exit_code})"]
    return lines + ([f"  cause: {hang.cause.text}"] if hang.cause is not None else [])


def _verdict_lines(report: Report) -> list[str]:
    stats = report.statistics
    if stats is None:
        return []
    measured = [r.statistics for r in report.ranks if r.statistics is not None and r.statistics.measured_steps]
    if not measured:  # one statistics line: the steps the table counts, or none at all
        seen = max((r.statistics.steps for r in report.ranks if r.statistics is not None), default=0)
        if seen:
            return [f"statistics: {seen} step(s) seen, none timed (each rank's first {WARMUP_STEPS} are warm-up)"]
        return ["statistics: no steps seen (telemetry.step(), or torch with an optimizer or DataLoader, gives them)"]
    median_step = statistics.median(s.step_time_s.mean for s in measured)
    lines = [format_verdict(s, median_step) for s in report.stragglers]
    if not lines:
        threshold = f"{stats.threshold_pct:g} % " if stats.threshold_pct is not None else ""
        lines.append(f"straggler: none (no rank makes the step {threshold}longer than the others' pace)")
    if report.step_imbalance is not None and report.step_imbalance.variance:
        lines.append(format_imbalance(report.step_imbalance))
    lines.extend(m.text for m in report.memory_asymmetry)
    if waits := waits_text(stats.waits_by_group):
        lines.append(f"waits by process group (the median rank's share of its step): {waits}")
    if stats.sync_bound_share:
        lines.append(
            f"synchronisation: every rank waits at least {100 * stats.sync_bound_share:.0f} % of its step for the "
            "others: the collectives themselves are slow (network, topology, NCCL settings), not one rank"
        )
    if stats.gpu_error:
        lines.append(f"gpu: {stats.gpu_error}")
    if stats.stats_file_error:
        lines.append(f"stats file: {stats.stats_file_error}")
    return lines
