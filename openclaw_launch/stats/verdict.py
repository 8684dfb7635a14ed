"""Who holds the job back, and in which phase. Pure: summaries in, verdicts out.

In synchronous training every rank's step takes as long as the slowest rank's, so step time
cannot name the straggler. The straggler is the rank that *waits least* at the synchronisation
points: its own time (``OWN``: the step minus its wait phases) is the longest. The phase is the
input/host stage (``input`` + ``host``) or the work phase in which it exceeds the others most
(stats/phases.py says which phase is which).

The threshold is a slowdown of the job: a rank is a straggler when it makes the step at least
``threshold_pct`` % longer than the others' pace (the step less its excess), an excess of
``threshold_pct / (100 + threshold_pct)`` of the step (``slowdown_floor_s``). The threshold is what
is always named: a rank is named from ``1 - THRESHOLD_MARGIN`` of it (4.5 % at the default 5), as
one run's excess is measured within about 0.3 % of the step of the slowdown it has. Pipeline
stages are the one exception, by the same rule: the time their excess is compared with is the
stage's own work, not the step, whose bubble no stage's work fills (stats/pipeline.py).

Every comparison is made window by window (collect.py: 5-step windows by step number, the same
steps on every rank, each a median): the excess is the median over the common windows of (the
rank's value - the other ranks' median), with the standard error of that median from the windows'
spread. A rank is named when its own excess is significant (``Z_SIGNIFICANT`` standard errors
above zero) and its own or its phase's excess reaches the threshold less its margin: noise on a
shared host neither names a balanced rank nor hides a slowdown at the threshold. Under 3 common
windows the means decide, without error.

Wait signals, best first: from torch's flight recorder (GPU; the CPU does not wait in NCCL
calls), the longest NCCL collective of each step (the first gradient bucket waits as long as the
last rank is late; summing all collectives would also count later buckets spinning while their
own rank still computes), else the CPU time of the phases that contain waiting (``sync``
sections, blocking collectives, and ``backward`` under DDP, where gradients are all-reduced).

GPU work the CPU cannot see (NCCL only enqueues; gloo on CUDA tensors waits in backward as long on
the fast ranks as on the slow one) is timed on the GPU: CUDA events on every 5th step
(telemetry/gpu_events.py) give each rank's GPU work per sampled step (collect's ``GPU_BUSY``).
With samples from every rank it is a candidate phase (``GPU_WORK``), and names a rank by itself
when no CPU signal does, by the same window rule.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from openclaw_launch.config.defaults import STRAGGLER_THRESHOLD_MARGIN as THRESHOLD_MARGIN
from openclaw_launch.config.defaults import STRAGGLER_THRESHOLD_PCT
from openclaw_launch.stats import imbalance, phases, pipeline
from openclaw_launch.stats.collect import GPU_BUSY, INPUT_STAGE, OWN, STEP, RankSummary
from openclaw_launch.stats.judged import PCT_OF_OWN_WORK, PctOf
from openclaw_launch.stats.median import medians_of_others
from openclaw_launch.stats.phases import GPU_WORK, INPUT_PHASES
from openclaw_launch.stats.result import MEMORY_ASYMMETRY_SHARE, DroppedDatagrams, GpuStats, RunStatistics, Straggler
from openclaw_launch.telemetry import wire

MIN_STEPS = 5  # measured steps a rank needs before it is judged
MIN_WINDOWS = 3  # windows all ranks have before their spread is trusted (else: the means)
Z_SIGNIFICANT = 3.0  # an excess is real when this many standard errors above zero
HIGH_SYNC_SHARE = 0.3  # every rank waiting this much of its step: the fabric, not one rank
# Phases that are nothing but waiting for peers and moving data (backward under DDP also computes).
_PURE_WAIT = (wire.SYNC, wire.COLLECTIVE)


@dataclass(frozen=True)
class RankFacts:
    """What else the launcher knows about a rank, for hints."""

    node: str
    gpu: GpuStats | None = None  # its GPU's samples
    binding_warning: str | None = None


def _wait(r: RankSummary, use_gpu: bool) -> float:
    return float(r.gpu_late_s or 0.0) if use_gpu else r.wait_s


def wait_source(ranks: Sequence[RankSummary]) -> str:
    """Which wait signal the ranks give: nccl-flight-recorder, cpu-phases or none."""
    if ranks and all(r.gpu_late_s is not None for r in ranks):
        return "nccl-flight-recorder"
    return "cpu-phases" if any(r.sync_phases for r in ranks) else "none"


def waited_for_others(ranks: Sequence[RankSummary]) -> dict[int, float]:
    """Per rank, the time per step it waited for the others: its wait signal minus the least any
    rank shows (that least part is the collectives' own cost, which every rank pays)."""
    use_gpu = wait_source(ranks) == "nccl-flight-recorder"
    if not ranks:
        return {}
    floor = min(_wait(r, use_gpu) for r in ranks)
    return {r.rank: _wait(r, use_gpu) - floor for r in ranks}


def find_stragglers(
    ranks: Sequence[RankSummary],
    facts: Mapping[int, RankFacts],
    threshold_pct: float = STRAGGLER_THRESHOLD_PCT,
) -> list[Straggler]:
    judged = [r for r in ranks if r.measured_steps >= MIN_STEPS]
    if len(judged) < 2:
        return []
    source = wait_source(judged)
    use_gpu = source == "nccl-flight-recorder"
    waited = waited_for_others(judged)
    busy = {r.rank: r.step_mean_s - waited[r.rank] for r in judged}
    median_step = statistics.median(_typical(r, STEP, r.step_mean_s) for r in judged)
    if median_step <= 0:
        return []
    stages = pipeline.is_pipeline(judged)

    def compared(r: RankSummary) -> tuple[PctOf, float]:  # what its excess is a share of (stats/pipeline.py)
        return pipeline.compared_with(
            stages, median_step, busy[r.rank] if use_gpu else _typical(r, OWN, r.step_mean_s - r.wait_s)
        )

    def floor_s(r: RankSummary) -> float:
        return slowdown_floor_s(threshold_pct, compared(r)[1])

    table: Excesses = functools.cache(functools.partial(excesses, judged))  # each key's, once
    own: Mapping[int, Excess]
    if use_gpu:  # the flight recorder's wait is per run, not per window
        values = [busy[r.rank] for r in judged]
        own = {r.rank: Excess(v - m, 0.0) for r, v, m in zip(judged, values, medians_of_others(values), strict=True)}
    else:
        own = table(OWN)
    slow = max(judged, key=lambda r: own[r.rank].estimate_s)
    busy_excess = own[slow.rank]
    section, phase_excess = _phase(slow, judged, use_gpu, table)
    # It holds the others back (its own time is significantly longer) by at least the threshold in
    # its own time or in one phase: the phase is measured directly, the own time loses a little of
    # the excess to the others' wake-up from waiting.
    if not (busy_excess.significant() and (busy_excess.reaches(floor_s(slow)) or phase_excess.reaches(floor_s(slow)))):
        gpu_slow = _gpu_straggler(judged, floor_s, table)
        if gpu_slow is not None:  # its GPU work, timed on the GPU, is longer: the CPU cannot see it
            slow = gpu_slow
            section, phase_excess = GPU_WORK, table(GPU_BUSY)[slow.rank]
        elif source == "cpu-phases":
            return []  # the wait signal says nobody holds the others back
        else:
            # No wait signal tells the ranks apart (GPU ranks without the flight recorder: the CPU
            # does not wait in NCCL). Waiting for input is measured on the CPU and comes before the
            # step's work, so a rank that waits longer for its data than the others still holds them back.
            inputs = table(INPUT_STAGE)
            slow = max(judged, key=lambda r: inputs[r.rank].estimate_s)
            busy_excess = inputs[slow.rank]
            if not (busy_excess.significant() and busy_excess.reaches(floor_s(slow))):
                return []
            section, phase_excess = _phase(slow, judged, use_gpu, table)
    others = [r for r in judged if r is not slow]
    if use_gpu and section != GPU_WORK and not (phase_excess.significant() and phase_excess.reaches(floor_s(slow))):
        section, phase_excess = GPU_WORK, busy_excess  # not in its input: its GPU work (or launches)
    if section == INPUT_STAGE:  # the input/host stage: name the part of it carrying more
        section = max(INPUT_PHASES, key=lambda p: table(p)[slow.rank].estimate_s)
    facts_slow = facts.get(slow.rank, RankFacts(node="?"))
    peers_wait = statistics.median(waited[r.rank] for r in others) - waited[slow.rank]
    pct_of, pct_of_s = compared(slow)
    return [
        Straggler(
            rank=slow.rank,
            node=facts_slow.node,
            phase=wire.INPUT if section in INPUT_PHASES else "compute",
            section=section,
            excess_s=phase_excess.estimate_s,
            excess_pct=100 * phase_excess.estimate_s / pct_of_s,
            busy_s=busy[slow.rank],
            peers_busy_s=statistics.median(busy[r.rank] for r in others),
            peers_wait_s=max(peers_wait, 0.0),
            wait_source=source,
            hints=tuple(
                [
                    *pipeline.hint(slow, judged),
                    *_hints(slow, section, facts_slow, [facts.get(o.rank) for o in others]),
                    *_group_hint(others),
                ]
            ),
            pct_of=pct_of,
            pct_of_s=pct_of_s,
        )
    ]


def fixed_only(found: Sequence[Straggler], judged: imbalance.Judged | None, threshold_pct: float) -> list[Straggler]:
    """The stragglers less those the aligned steps (``judged``, stats/imbalance.py) show are per-batch
    variance, not a fixed rank (``imbalance.moving_stragglers``, by this verdict's floor and
    significance): a node's verdict and the job report's alike."""

    def moving(s: Straggler) -> bool:
        def floor_s(step_s: float) -> float:  # a pipeline stage's: of its own work, as the verdict's
            own_s = s.pct_of_s if s.pct_of == PCT_OF_OWN_WORK and s.pct_of_s is not None else None
            return slowdown_floor_s(threshold_pct, own_s if own_s is not None else step_s)

        return s.rank in imbalance.moving_stragglers([s.rank], judged, floor_s, Z_SIGNIFICANT)

    return [s for s in found if not moving(s)]


def slowdown_floor_s(threshold_pct: float, compared_s: float) -> float:
    """The excess per step from which a rank is named when the time its excess is compared with is
    ``compared_s`` (the job's step; a pipeline stage's own work, stats/pipeline.py): the excess that
    makes it ``(1 - THRESHOLD_MARGIN) * threshold_pct`` % longer than the others' (``compared_s`` -
    excess); a 4.5 % slowdown is 4.5/104.5 of the step it produces."""
    named_pct = (1 - THRESHOLD_MARGIN) * threshold_pct
    return named_pct / (100 + named_pct) * compared_s


@dataclass(frozen=True)
class Excess:
    """A rank's time in one quantity over the other ranks', per step: the median over the windows
    all ranks have of (its value - the others' median), with the standard error of that median."""

    estimate_s: float
    stderr_s: float

    def significant(self) -> bool:
        """``Z_SIGNIFICANT`` standard errors above zero."""
        return self.estimate_s > 0 and self.estimate_s > Z_SIGNIFICANT * self.stderr_s

    def reaches(self, floor_s: float) -> bool:
        """At or over ``floor_s`` (``slowdown_floor_s``, whose margin is the tolerance for noise)."""
        return self.estimate_s > 0 and self.estimate_s >= floor_s


# A key's excesses of every judged rank (``excesses`` on them, each key computed once a verdict).
Excesses = Callable[[str], Mapping[int, Excess]]


def excesses(ranks: Sequence[RankSummary], key: str) -> dict[int, Excess]:
    """Each rank's excess in ``key`` (a phase, or collect's OWN / INPUT_STAGE / GPU_BUSY) over the
    other ``ranks``, by rank. With fewer than ``MIN_WINDOWS`` windows common to all: from the means,
    without an error. A phase a window lacks was 0 there; GPU_BUSY is compared only where every rank
    has a sample. Each window's values are sorted once for every rank's others' median
    (stats/median.py): O(n log n) a window, not O(n² log n)."""
    by_window = [dict(r.windows) for r in ranks]
    common = sorted(set.intersection(*(set(w) for w in by_window)))
    if key == GPU_BUSY:
        common = [k for k in common if all(key in w[k] for w in by_window)]
    if len(common) < MIN_WINDOWS:
        means = [_mean(r, key) for r in ranks]
        return {r.rank: Excess(v - m, 0.0) for r, v, m in zip(ranks, means, medians_of_others(means), strict=True)}
    diffs: list[list[float]] = [[] for _ in ranks]
    for k in common:
        values = [w[k].get(key, 0.0) for w in by_window]
        for row, v, m in zip(diffs, values, medians_of_others(values), strict=True):
            row.append(v - m)
    return {r.rank: _window_excess(row) for r, row in zip(ranks, diffs, strict=True)}


def _window_excess(diffs: Sequence[float]) -> Excess:
    """The median of a rank's per-window differences, with its standard error from their spread."""
    middle = statistics.median(diffs)
    spread_s = 1.4826 * statistics.median(abs(d - middle) for d in diffs)  # robust standard deviation
    return Excess(middle, 1.253 * spread_s / math.sqrt(len(diffs)))  # the median's standard error


def _mean(r: RankSummary, key: str) -> float:
    if key == GPU_BUSY:
        return r.gpu_busy_s or 0.0
    if key == INPUT_STAGE:
        return sum(r.phase_mean(p) for p in INPUT_PHASES)
    return r.step_mean_s - r.wait_s if key == OWN else r.phase_mean(key)


def _typical(r: RankSummary, key: str, default: float) -> float:
    """The median over a rank's windows of ``key``; ``default`` without windows."""
    values = [w.get(key, 0.0) for _, w in r.windows]
    return statistics.median(values) if values else default


def _phase(slow: RankSummary, judged: Sequence[RankSummary], use_gpu: bool, table: Excesses) -> tuple[str, Excess]:
    """The phase in which ``slow`` exceeds the others most: the input/host stage (as a whole), a
    work phase (not with the flight recorder: the CPU's view of GPU work is launches) or, with
    sampled GPU work on every rank, its GPU work (``GPU_WORK``). ``table``: the judged ranks' excesses."""
    sync = set().union(*(r.sync_phases for r in judged))
    candidates = {INPUT_STAGE: table(INPUT_STAGE)[slow.rank]}
    if not use_gpu:
        work = sorted(p for p in slow.phases if phases.kind(p, sync) == phases.WORK)
        candidates.update({p: table(p)[slow.rank] for p in work})
    if all(r.gpu_busy_s is not None for r in judged):  # its GPU work, timed on the GPU
        candidates[GPU_WORK] = table(GPU_BUSY)[slow.rank]
    section = max(candidates, key=lambda p: candidates[p].estimate_s)
    return section, candidates[section]


def _gpu_straggler(
    judged: Sequence[RankSummary], floor_s: Callable[[RankSummary], float], table: Excesses
) -> RankSummary | None:
    """The rank whose GPU work (CUDA events on sampled steps) exceeds the others' significantly and
    by about the threshold, when every rank has samples."""
    if not all(r.gpu_busy_s is not None for r in judged):
        return None
    gpu = table(GPU_BUSY)
    slow = max(judged, key=lambda r: gpu[r.rank].estimate_s)
    found = gpu[slow.rank]
    return slow if found.significant() and found.reaches(floor_s(slow)) else None


def _hints(slow: RankSummary, section: str, mine: RankFacts, peers: Sequence[RankFacts | None]) -> list[str]:
    """Evidence from outside the step timings that says why."""
    hints: list[str] = []
    if section == wire.INPUT:
        share = slow.phases[wire.INPUT].share if wire.INPUT in slow.phases else 0.0
        hints.append(
            f"input pipeline: {100 * share:.0f} % of its step waiting for data "
            "(more DataLoader workers, pinned memory, a faster or local dataset copy)"
        )
    elif section == wire.HOST:
        share = slow.phases[wire.HOST].share if wire.HOST in slow.phases else 0.0
        hints.append(
            f"host: {100 * share:.0f} % of its step in the loop's own code before the forward or between the forward "
            "and the backward (batch slicing or the next batch's fetch, host-to-device copies, logging, checkpoints)"
        )
    if mine.binding_warning:
        hints.append(f"affinity: {mine.binding_warning}")
    gpu = mine.gpu
    if gpu is None:
        return hints
    peer_gpus = [p.gpu for p in peers if p is not None and p.gpu is not None]
    clock = gpu.sm_clock_mhz_mean
    peer_clocks = [g.sm_clock_mhz_mean for g in peer_gpus if g.sm_clock_mhz_mean is not None]
    if clock is not None and peer_clocks and clock < 0.97 * statistics.median(peer_clocks):
        median_clock = statistics.median(peer_clocks)
        hints.append(f"clocks: its GPU ran at {clock:.0f} MHz vs {median_clock:.0f} MHz on the others")
    if gpu.clock_event_reasons:
        hints.append(f"thermal/power: clock-event reasons on its GPU: {', '.join(gpu.clock_event_reasons)}")
    memory = gpu.memory_used_mib_max
    peer_memory = [g.memory_used_mib_max for g in peer_gpus if g.memory_used_mib_max is not None]
    if memory is not None and peer_memory:
        median_memory = statistics.median(peer_memory)
        if abs(memory - median_memory) > MEMORY_ASYMMETRY_SHARE * median_memory:  # the finding's threshold
            hints.append(
                f"partitioning: its GPU holds {memory / 1024:.1f} GiB vs {median_memory / 1024:.1f} GiB on the others "
                "(uneven shards or batch sizes?)"
            )
    return hints


def sync_bound(ranks: Sequence[RankSummary]) -> float | None:
    """The smallest share of the step any rank spends waiting, when every rank waits a lot: then the
    synchronisation itself (network, topology) is slow, not one rank."""
    judged = [r for r in ranks if r.measured_steps >= MIN_STEPS and r.step_mean_s > 0]
    if len(judged) < 2:
        return None
    shares = [
        (r.gpu_sync_s if r.gpu_sync_s is not None else sum(r.phase_mean(p) for p in _PURE_WAIT)) / r.step_mean_s
        for r in judged
    ]
    least = min(shares)
    return least if least >= HIGH_SYNC_SHARE else None


def group_waits(ranks: Sequence[RankSummary]) -> dict[str, float]:
    """Per process group (stats/groups.py's name), the median over ``ranks`` of the share of the
    step each waited in its calls (a rank that never called it: 0)."""
    names = sorted({name for r in ranks for name in r.group_waits})
    return {name: statistics.median(r.group_waits.get(name, 0.0) for r in ranks) for name in names}


def _group_hint(others: Sequence[RankSummary]) -> list[str]:
    """Which process groups the other ranks wait in (for it), as shares of their step."""
    from openclaw_launch.stats.groups import waits_text

    text = waits_text(group_waits(others))
    return [f"waits: the other ranks wait in {text} of their step (by process group)"] if text else []


def run_statistics(
    summaries: Sequence[RankSummary],
    threshold_pct: float | None,
    gpu_error: str | None,
    stats_file_error: str | None,
    dropped: Mapping[str, DroppedDatagrams],
) -> RunStatistics:
    """The report's ``statistics`` over ``summaries`` (a node's ranks, or every node's for the job
    report): the wait signal they give, whether the synchronisation itself is slow, and what was
    lost on the way (``dropped``: per rank, its number as the key)."""
    return RunStatistics(
        threshold_pct=threshold_pct,
        wait_source=wait_source(summaries),
        sync_bound_share=sync_bound(summaries),
        gpu_error=gpu_error,
        stats_file_error=stats_file_error,
        bad_datagrams=sum(d.total for d in dropped.values()),
        dropped_datagrams=dict(dropped),
        waits_by_group={name: round(share, 4) for name, share in group_waits(summaries).items()},
    )
