"""``openclaw-launch compare BASE.json NEW.json``: what changed between two reports of the same job.

The step time (the median over ranks of each rank's mean step: the phases are means too), the rank
and phase that explain the change (the largest change of a rank's input/host or work phase, in the
direction of the step's; every rank when all changed alike; waiting is never the explanation: it is
the others' share of a straggler's time), the straggler verdicts of both, and per rank the GPU facts
that differ (SM clock by more than 3 %, throttle reasons, another GPU). Pure: two reports in, lines
out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from openclaw_launch.errors import OpenclawError
from openclaw_launch.report.membership import Exclusion
from openclaw_launch.report.model import JobReport, NodeReport
from openclaw_launch.report.rank import RankEntry, StepStatistics
from openclaw_launch.stats import phases
from openclaw_launch.stats.result import GpuStats, Straggler

Report = NodeReport | JobReport
CLOCK_CHANGE = 0.03  # an SM clock this much lower or higher is a difference
ALIKE = 0.5  # every rank's change at least this share of the largest: the whole job changed


def check_comparable(base: Report, new: Report) -> None:
    """Reports of one job: the same world size and ranks (another run id is fine: that is the point)."""
    if base.world_size != new.world_size:
        raise OpenclawError(
            f"compare: not reports of the same job: world size {base.world_size} in BASE, {new.world_size} in NEW"
        )
    if sorted(r.rank for r in base.ranks) != sorted(r.rank for r in new.ranks):
        raise OpenclawError("compare: not reports of the same job: BASE and NEW list different ranks")


def compare_reports(base: Report, new: Report) -> list[str]:
    """The comparison as lines (``check_comparable`` first)."""
    check_comparable(base, new)
    lines = [f"base: run {base.run_id}, exit {base.exit_code}; new: run {new.run_id}, exit {new.exit_code}"]
    before, after = _stats(base.ranks), _stats(new.ranks)
    if not before or not after:
        missing = " and ".join(name for name, s in (("BASE", before), ("NEW", after)) if not s)
        lines.append(f"step time: no step statistics in {missing}")
    else:
        step_a = statistics.median(s.step_time_s.mean for s in before.values())
        step_b = statistics.median(s.step_time_s.mean for s in after.values())
        change = step_b - step_a
        lines.append(
            f"step time: {_ms(step_a)} -> {_ms(step_b)} ms/step ({_signed_ms(change)} ms, "
            f"{100 * change / step_a if step_a else 0.0:+.1f} %)"
        )
        lines += _explanation(before, after, change)
    lines.append(f"straggler: base {_verdict(base.stragglers)}; new {_verdict(new.stragglers)}")
    if base.exclusions or new.exclusions:
        lines.append(f"exclusions: base {_excluded(base.exclusions)}; new {_excluded(new.exclusions)}")
    lines += _gpu_lines({r.rank: r for r in base.ranks}, {r.rank: r for r in new.ranks})
    return lines


def _stats(ranks: Sequence[RankEntry]) -> dict[int, StepStatistics]:
    return {r.rank: r.statistics for r in ranks if r.statistics is not None and r.statistics.measured_steps}


def _own_phases(s: StepStatistics) -> dict[str, float]:
    """A rank's input/host and work phases (mean per step); the wait phases are left out."""
    return {n: sec.mean for n, sec in s.sections.items() if phases.kind(n, s.sync_sections) != phases.WAIT}


def _explanation(before: dict[int, StepStatistics], after: dict[int, StepStatistics], change_s: float) -> list[str]:
    ranks = sorted(set(before) & set(after))
    deltas: dict[tuple[int, str], float] = {}
    for rank in ranks:
        old, new = _own_phases(before[rank]), _own_phases(after[rank])
        for name in set(old) | set(new):
            deltas[rank, name] = new.get(name, 0.0) - old.get(name, 0.0)
    if not deltas:
        return []
    sign = 1.0 if change_s >= 0 else -1.0
    (rank, name), largest = max(deltas.items(), key=lambda item: sign * item[1])
    if sign * largest <= 0:
        return ["explained by: no rank's input/host or work phase changed in that direction"]
    where = f"its input/host stage ({name})" if name in phases.INPUT_PHASES else name
    per_rank = [deltas.get((r, name), 0.0) for r in ranks]
    alike = min(sign * d for d in per_rank) >= ALIKE * sign * largest
    was, now = _own_phases(before[rank]).get(name, 0.0), _own_phases(after[rank]).get(name, 0.0)
    who = "every rank" if alike else f"rank {rank}"
    lines = [f"explained by: {who}, {where} {_signed_ms(largest)} ms/step ({_ms(was)} -> {_ms(now)} ms on rank {rank})"]
    others = [r for r in ranks if r != rank]
    if not alike and others:
        lines.append(
            f"  the other ranks wait for the others {_ms(statistics.median(before[r].wait_s for r in others))} -> "
            f"{_ms(statistics.median(after[r].wait_s for r in others))} ms/step (median)"
        )
    return lines


def _verdict(found: Sequence[Straggler]) -> str:
    if not found:
        return "none"
    return ", ".join(f"rank {s.rank} ({s.phase}, {s.section}) {_signed_ms(s.excess_s)} ms/step" for s in found)


def _excluded(found: Sequence[Exclusion]) -> str:
    if not found:
        return "none"
    return ", ".join(f"{x.node} ({x.reason}, after world {x.world})" for x in found)


def _gpu_lines(before: dict[int, RankEntry], after: dict[int, RankEntry]) -> list[str]:
    lines = []
    for rank in sorted(set(before) & set(after)):
        a, b = before[rank], after[rank]
        if a.gpu_uuid != b.gpu_uuid and (a.gpu_uuid or b.gpu_uuid):
            lines.append(f"gpu: rank {rank} ran on {a.gpu_uuid or 'no GPU'}, now on {b.gpu_uuid or 'no GPU'}")
        if a.gpu is None or b.gpu is None:
            continue
        lines += [f"gpu: rank {rank}: {d}" for d in _gpu_differences(a.gpu, b.gpu)]
    return lines


def _gpu_differences(a: GpuStats, b: GpuStats) -> list[str]:
    out = []
    for key, label in (("sm_clock_mhz_mean", "SM clock"), ("sm_clock_mhz_min", "lowest SM clock")):
        was, now = getattr(a, key), getattr(b, key)
        if was and now and abs(now - was) > CLOCK_CHANGE * was:
            out.append(f"{label} {was:.0f} -> {now:.0f} MHz")
    gained = sorted(set(b.clock_event_reasons) - set(a.clock_event_reasons))
    lost = sorted(set(a.clock_event_reasons) - set(b.clock_event_reasons))
    if gained:
        out.append(f"throttle reasons now: {', '.join(gained)}")
    if lost:
        out.append(f"throttle reasons gone: {', '.join(lost)}")
    return out


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def _signed_ms(seconds: float) -> str:
    return f"{1000 * seconds:+.1f}"
