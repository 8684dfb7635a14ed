"""Per-step imbalance without a fixed straggler: which rank was the slowest at each step, and what the
spread between the ranks costs.

The straggler verdict (stats/verdict.py) compares 5-step window medians, which is right for a rank
that is always slow and blind by design to a cost that moves: when every step one rank drawn at
random gets a costlier batch, each rank's medians look alike, yet every step waits for its slowest
rank. This module aligns the ranks step by step instead. Step n of every rank is the same training
step (every rank counts its steps from the attempt's first, as stats/collect.py does; a batch the
rank could not send ends the alignment of its later steps), and a step's *work* is its time outside
the phases that wait for peers (``sync_phases``), so the rank that makes the others wait shows the
most work.

Pure arithmetic on the batches the session already takes: O(ranks log ranks) per step, and at most
``MAX_PENDING_STEPS`` steps held while a rank's batch is late. ``judge`` decides whether it is a
finding (``StepImbalance.variance``).

Across nodes (the job report, agents/merge.py): each node keeps its ranks' last ``RECENT_STEPS``
steps (``StepAlignment.recent``, whether or not the node has two ranks) and sends them with its
report; the first node lines every node's up by step number (``aligned``) and judges them as one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from openclaw_launch.stats.collect import WARMUP_STEPS
from openclaw_launch.stats.histogram import LogHistogram
from openclaw_launch.stats.median import medians_of_others
from openclaw_launch.telemetry import wire

# The finding needs this many aligned steps: fewer, and "how often each rank was the slowest" is chance.
MIN_STEPS = 20
# The spread must cost at least this share of the step, as the median over steps (robust to the odd
# stalled step a shared host adds) and as the mean: below it, the per-step noise of a shared host.
MIN_COST_PCT = 10.0
MAX_PENDING_STEPS = 4096  # steps waiting for a late rank's batch; beyond, the oldest is given up
# Per rank, the last steps (and sampled GPU steps) a node sends the first node for the job report:
# about 16 bytes of JSON each, 16 KiB a rank; the job's per-step imbalance is judged over them.
RECENT_STEPS = 1000


@dataclass
class _Tally:
    """Bounded: sums for the means, log-spaced histograms for the medians (stats/histogram.py)."""

    steps: int = 0
    slowest: dict[int, int] = field(default_factory=dict)  # rank -> steps it was the slowest
    cost: LogHistogram = field(default_factory=LogHistogram)  # per step: slowest's work - the others' median
    step: LogHistogram = field(default_factory=LogHistogram)  # per step: the median rank's step time (CPU)
    work_total_s: float = 0.0  # the other ranks' median work, summed over steps
    # per rank, over steps: its work minus the other ranks' median, summed and squared (a fixed
    # straggler's offset holds at every step; per-batch variance averages out)
    excess_sum_s: dict[int, float] = field(default_factory=dict)
    excess_sq_s2: dict[int, float] = field(default_factory=dict)


class StepAlignment:
    """The ranks' steps side by side. ``add`` every batch of the attempt; ``expect`` the attempt's
    ranks (a step is judged once each of them sent it); ``tally`` what was judged."""

    def __init__(self, ranks: Iterable[int]) -> None:
        self._expected = frozenset(ranks)
        self._counts: dict[int, int] = {}  # rank -> steps seen (warm-up included)
        self._broken: set[int] = set()  # ranks with a lost batch: their later steps do not align
        self._pending: dict[int, dict[int, tuple[float, float]]] = {}  # step -> rank -> (step_s, work_s)
        self._tally = _Tally()
        # The sampled steps' GPU work (CUDA events, telemetry/gpu_events.py: the same step numbers on
        # every rank, the worker's own, so a lost batch does not shift them): step -> rank -> seconds.
        self._gpu_pending: dict[int, dict[int, float]] = {}
        self._gpu = _Tally()
        self.given_up = 0  # steps dropped: a rank never sent them, or too many were pending
        # per rank, its last aligned steps (step_s, work_s) and sampled GPU steps, for the job report
        self._recent: dict[int, deque[tuple[float, float]]] = {}
        self._recent_gpu: dict[int, deque[tuple[int, float]]] = {}

    @property
    def ranks(self) -> frozenset[int]:
        return self._expected

    def expect(self, ranks: Iterable[int]) -> None:
        """A new attempt, or its ranks (an elastic world re-formed): everything before is forgotten."""
        self._expected = frozenset(ranks)
        self._counts.clear()
        self._broken.clear()
        self._pending.clear()
        self._tally = _Tally()
        self._gpu_pending.clear()
        self._gpu = _Tally()
        self.given_up = 0
        self._recent.clear()
        self._recent_gpu.clear()

    def add(self, batch: wire.Batch) -> None:
        rank = batch.rank
        if rank not in self._expected:
            return
        self._add_gpu(rank, batch.gpu_busy)
        if rank in self._broken:
            return
        if batch.dropped_batches:  # this batch follows lost ones: its steps' numbers are unknown
            self._broken.add(rank)
            return
        count = self._counts.get(rank, 0)
        self._counts[rank] = count + len(batch.steps)
        for offset, (step_s, phases) in enumerate(batch.steps):
            index = count + offset
            if index < WARMUP_STEPS:
                continue
            work_s = max(step_s - sum(phases.get(p, 0.0) for p in batch.sync_phases), 0.0)
            self._recent.setdefault(rank, deque(maxlen=RECENT_STEPS)).append((step_s, work_s))
            self._put(index, rank, step_s, work_s)

    def _put(self, index: int, rank: int, step_s: float, work_s: float) -> None:
        """Step ``index`` of ``rank``: judged once every expected rank has it."""
        if len(self._expected) < 2:
            return
        row = self._pending.setdefault(index, {})
        row[rank] = (step_s, work_s)
        if len(row) == len(self._expected):
            self._close(self._pending.pop(index))
        while len(self._pending) > MAX_PENDING_STEPS:
            del self._pending[min(self._pending)]
            self.given_up += 1

    def _add_gpu(self, rank: int, samples: Iterable[tuple[int, float]]) -> None:
        for step, seconds in samples:
            if step <= WARMUP_STEPS:  # numbered as the collector counts steps (from 1)
                continue
            self._recent_gpu.setdefault(rank, deque(maxlen=RECENT_STEPS)).append((step, seconds))
            if len(self._expected) < 2:
                continue
            row = self._gpu_pending.setdefault(step, {})
            row[rank] = seconds
            if len(row) == len(self._expected):
                _tally_step(self._gpu, self._gpu_pending.pop(step))
        while len(self._gpu_pending) > MAX_PENDING_STEPS:
            del self._gpu_pending[min(self._gpu_pending)]

    def recent(self) -> tuple[RankSteps, ...]:
        """Each rank's last ``RECENT_STEPS`` aligned steps, to the microsecond (what the node sends
        the first node). A rank's steps are consecutive: after a lost batch it adds none."""
        out = []
        for rank in sorted(self._expected):
            rows, gpu = self._recent.get(rank, ()), self._recent_gpu.get(rank, ())
            if rows or gpu:
                out.append(
                    RankSteps(
                        rank=rank,
                        first=self._counts.get(rank, 0) - len(rows),
                        step_s=tuple(round(s, 6) for s, _ in rows),
                        work_s=tuple(round(w, 6) for _, w in rows),
                        gpu=tuple((step, round(seconds, 6)) for step, seconds in gpu),
                    )
                )
        return tuple(out)

    def _close(self, row: dict[int, tuple[float, float]]) -> None:
        import statistics  # not on the launcher's start path: the first full step imports it

        _tally_step(self._tally, {rank: work for rank, (_, work) in row.items()})
        self._tally.step.add(statistics.median(s for s, _ in row.values()))

    def judge(self) -> Judged | None:
        """The steps judged so far (None before ``MIN_STEPS`` aligned steps, or with one rank). With
        the GPU work of ``MIN_STEPS`` sampled steps from every rank (GPU ranks), the work whose spread
        costs more: the CPU does not see a GPU's kernels (NCCL only enqueues, the host then waits for
        its own GPU and its peers alike), the GPU does not see the host's input work."""
        cpu = self._tally
        if cpu.steps < MIN_STEPS or len(self._expected) < 2:
            return None
        mean_step, median_step = cpu.step.mean, cpu.step.quantile(0.5)
        t, source = cpu, "cpu"
        gpu = self._gpu
        if gpu.steps >= MIN_STEPS and gpu.cost.mean > cpu.cost.mean:
            t, source = gpu, "gpu"
        mean_cost, median_cost = t.cost.mean, t.cost.quantile(0.5)
        shares = {rank: t.slowest.get(rank, 0) / t.steps for rank in sorted(self._expected)}
        pct = 100 * mean_cost / mean_step if mean_step else 0.0
        median_pct = 100 * median_cost / median_step if median_step else 0.0
        top = max(shares.values())
        return Judged(
            variance=pct >= MIN_COST_PCT and median_pct >= MIN_COST_PCT and top <= fixed_rank_share(len(shares)),
            steps=t.steps,
            slowest_share=shares,
            cost_s=mean_cost,
            cost_pct=pct,
            median_cost_s=median_cost,
            step_s=mean_step,
            work_s=t.work_total_s / t.steps,
            work_source=source,
            excess_s={rank: t.excess_sum_s.get(rank, 0.0) / t.steps for rank in sorted(self._expected)},
            excess_error_s={rank: _standard_error(t, rank) for rank in sorted(self._expected)},
        )


def _standard_error(t: _Tally, rank: int) -> float:
    """Of the mean per-step excess of ``rank``, from the steps' spread."""
    import math

    n = t.steps
    mean = t.excess_sum_s.get(rank, 0.0) / n
    variance = max(t.excess_sq_s2.get(rank, 0.0) / n - mean * mean, 0.0) * n / max(n - 1, 1)
    return math.sqrt(variance / n)


def _tally_step(t: _Tally, works: dict[int, float]) -> None:
    """One aligned step: its slowest rank, and each rank's work over the other ranks' median (the
    step's works sorted once, stats/median.py: O(ranks log ranks) a step)."""
    slowest = max(sorted(works), key=works.__getitem__)
    others_median = dict(zip(works, medians_of_others(list(works.values())), strict=True))
    median_work = others_median[slowest]
    t.steps += 1
    t.slowest[slowest] = t.slowest.get(slowest, 0) + 1
    t.cost.add(works[slowest] - median_work)
    t.work_total_s += median_work
    for rank, work in works.items():
        excess = work - others_median[rank]
        t.excess_sum_s[rank] = t.excess_sum_s.get(rank, 0.0) + excess
        t.excess_sq_s2[rank] = t.excess_sq_s2.get(rank, 0.0) + excess * excess


@dataclass(frozen=True)
class RankSteps:
    """One rank's last aligned steps as its node sends them (``StepAlignment.recent``): ``first`` the
    index of the first (steps counted from the attempt's first on every node), each step's time and
    its work (the step outside the waiting phases); ``gpu``: sampled steps' GPU work (step, seconds)."""

    rank: int
    first: int
    step_s: tuple[float, ...]
    work_s: tuple[float, ...]
    gpu: tuple[tuple[int, float], ...]


def aligned(parts: Iterable[RankSteps], ranks: Iterable[int]) -> StepAlignment:
    """Every node's ranks' recent steps side by side, by step number: the job's alignment (its
    ``judge`` over the steps every rank of ``ranks`` sent)."""
    alignment = StepAlignment(ranks)
    for part in parts:
        if part.rank not in alignment.ranks:
            continue
        alignment._add_gpu(part.rank, part.gpu)
        for offset, (step_s, work_s) in enumerate(zip(part.step_s, part.work_s, strict=False)):
            alignment._put(part.first + offset, part.rank, step_s, work_s)
    return alignment


@dataclass(frozen=True)
class Judged:
    """What ``judge`` found, unrounded (the report's type, ``result.StepImbalance``, is made from it)."""

    variance: bool  # the finding: costly, and no rank is the slowest often enough to be a fixed straggler
    steps: int
    slowest_share: dict[int, float]  # rank -> share of the steps it was the slowest
    cost_s: float  # mean over steps: the slowest rank's work - the others' median
    cost_pct: float  # of the mean step
    median_cost_s: float
    step_s: float  # the mean step (each: the ranks' median)
    work_s: float  # the mean of the others' median work
    work_source: str  # "cpu": the host's phases of every step; "gpu": the sampled steps' GPU work
    excess_s: dict[int, float]  # rank -> mean over steps of its work minus the other ranks' median
    excess_error_s: dict[int, float]  # rank -> the standard error of that mean


def moving_stragglers(
    ranks: Iterable[int], found: Judged | None, floor_s: Callable[[float], float], z_significant: float
) -> set[int]:
    """Of the ranks the verdict named (stats/verdict.py, 5-step window medians), those the aligned
    steps show are per-batch variance, not a fixed straggler: only with the variance finding, a rank
    whose mean per-step excess does not reach the verdict's floor (``floor_s`` of the step) or is not
    ``z_significant`` standard errors above zero (the verdict's own rules, passed in: it imports this
    module's report type). Window medians turn a random draw into a majority of windows for one rank
    (two ranks, one costly batch per step: one rank wins most windows by chance, and each shows the
    whole cost); its excess over every step averages out."""
    if found is None or not found.variance:
        return set()
    floor = floor_s(found.step_s)
    out = set()
    for rank in ranks:
        excess, error = found.excess_s.get(rank, 0.0), found.excess_error_s.get(rank, 0.0)
        if excess < floor or excess < z_significant * error:
            out.add(rank)
    return out


def live_text(found: Judged | None) -> str:
    """The live line's part, with the finding only (over the attempt so far, not one interval)."""
    if found is None or not found.variance:
        return ""
    return f"; per-step imbalance: the slowest rank varies, {1000 * found.cost_s:.1f} ms/step ({found.cost_pct:.0f} %)"


def fixed_rank_share(ranks: int) -> float:
    """Above this share of the steps one rank is the slowest, it is a fixed straggler, not variance:
    halfway between chance (1/ranks) and always (1). Two ranks: 75 %; eight: 56 %."""
    return (1.0 + 1.0 / ranks) / 2


BALANCE_HINT = (
    "balance the batches by cost, not by sample count: bucket samples of similar length together "
    "(length bucketing), or pack each batch to a token budget, so that every rank's batch costs about "
    "the same at every step"
)
