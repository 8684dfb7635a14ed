"""Per-rank accumulation of the workers' batches into bounded summaries.

The first ``WARMUP_STEPS`` steps of each rank are counted but left out of the distributions
(compilation, allocator and autotuning make them unrepresentative). ``window()`` gives the same
summary over the steps since its previous call, for the live one-line report.

For the verdict, each rank's steps are also cut into windows of ``WINDOW_STEPS`` by step number
(step n of every rank is the same training step, so window k is the same stretch of time on every
rank) and each window keeps the median of every phase, of the step (``STEP``), of the time not in
wait phases (``OWN``) and of the input/host stage (``INPUT_STAGE``): medians resist the stalls a
shared machine adds to single steps, and comparing ranks window by window cancels what every rank
suffered at once. The last ``MAX_WINDOWS`` windows are kept. A window also holds the median of
the rank's sampled GPU work (``GPU_BUSY``, CUDA events on every 5th step, telemetry/gpu_events.py)
once a sample of it arrived, which may be a batch later than the window's steps.

Waits are also summed per process group (``group_waits``: the share of the rank's step time, over
every step of the attempt, warm-up included, spent waiting in the group's calls), under the names
``Collector``'s ``namer`` gives the workers' keys (stats/groups.py: ``dp``, ``pp``, ...).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from openclaw_launch.stats.histogram import LogHistogram
from openclaw_launch.stats.phases import INPUT_PHASES
from openclaw_launch.telemetry import wire, wire_check

WARMUP_STEPS = 3
OTHER = "other"  # step time no phase claimed
WINDOW_STEPS = 5
MAX_WINDOWS = 1024
MAX_GROUPS = 64  # process groups a rank's waits are summed for; a later one is left out
# Keys of a window besides the phase names (which never start with "@").
STEP, OWN, INPUT_STAGE, GPU_BUSY = "@step", "@own", "@input", "@gpu"


@dataclass(frozen=True)
class PhaseSummary:
    mean_s: float  # per step, averaged over measured steps (phases add up to the step)
    p50_s: float
    p90_s: float
    share: float  # of the mean step time


@dataclass(frozen=True)
class RankSummary:
    rank: int
    steps: int  # all steps seen
    measured_steps: int  # steps in the distributions (after warm-up)
    step_p50_s: float
    step_p90_s: float
    step_p99_s: float
    step_max_s: float
    step_mean_s: float
    phases: dict[str, PhaseSummary]
    sync_phases: tuple[str, ...]  # phases that contain waiting for other ranks
    gpu_sync_s: float | None  # NCCL collective time per step (flight recorder), when known
    gpu_late_s: float | None  # the longest collective per step (how long this rank waited for the last)
    step_source: str
    dropped_batches: int
    # (window number, {phase or STEP/OWN/INPUT_STAGE: median seconds per step}), oldest first
    windows: tuple[tuple[int, Mapping[str, float]], ...] = ()
    gpu_busy_s: float | None = None  # mean GPU work of the sampled steps (CUDA events), when sampled
    pipeline: tuple[int, int, int] | None = None  # a pipeline stage: (stage, stages, micro-batches)
    group_waits: dict[str, float] = field(default_factory=dict)  # process group -> share of the step waited in it

    def phase_mean(self, name: str) -> float:
        phase = self.phases.get(name)
        return phase.mean_s if phase is not None else 0.0

    @property
    def wait_s(self) -> float:
        """Time per step in phases that contain waiting for peers (CPU view)."""
        return sum(self.phase_mean(p) for p in self.sync_phases)


@dataclass
class _RankStats:
    rank: int
    steps: int = 0
    step: LogHistogram = field(default_factory=LogHistogram)
    phases: dict[str, LogHistogram] = field(default_factory=dict)
    sync_phases: set[str] = field(default_factory=set)
    gpu_sync_total_s: float = 0.0
    gpu_late_total_s: float = 0.0
    gpu_steps: int = 0  # steps the flight recorder's numbers cover
    step_source: str = "none"
    dropped_batches: int = 0
    windows: deque[tuple[int, dict[str, float]]] = field(default_factory=lambda: deque(maxlen=MAX_WINDOWS))
    _open: list[dict[str, float]] = field(default_factory=list)  # the current window's steps
    _open_index: int = -1
    gpu_busy: dict[int, list[float]] = field(default_factory=dict)  # window -> sampled GPU work, seconds
    gpu_busy_total_s: float = 0.0
    gpu_busy_count: int = 0
    pipeline: tuple[int, int, int] | None = None
    group_wait_s: dict[str, float] = field(default_factory=dict)  # per group key, over every step
    step_total_s: float = 0.0  # every step's time, warm-up included (the groups' waits' base)

    def add(self, batch: wire.Batch) -> None:
        self.step_source = batch.step_source
        self.pipeline = batch.pipeline or self.pipeline
        self.step_total_s += sum(step_s for step_s, _ in batch.steps)
        for key, seconds in batch.group_waits.items():
            if key in self.group_wait_s or len(self.group_wait_s) < MAX_GROUPS:
                self.group_wait_s[key] = self.group_wait_s.get(key, 0.0) + seconds
        self.sync_phases.update(batch.sync_phases)
        self.dropped_batches += batch.dropped_batches
        measured = 0
        for step_s, phases in batch.steps:
            self.steps += 1
            if self.steps <= WARMUP_STEPS:
                continue
            measured += 1
            self.step.add(step_s)
            claimed = 0.0
            for name in (set(self.phases) | set(phases)) - {OTHER}:
                value = phases.get(name, 0.0)
                claimed += value
                self._phase(name).add(value)
            other = max(step_s - claimed, 0.0)
            self._phase(OTHER).add(other)
            self._window_step(step_s, {**phases, OTHER: other}, batch.sync_phases)
        for step, seconds in batch.gpu_busy:
            if step > WARMUP_STEPS:  # numbered as self.steps counts: the same window as the step's
                self.gpu_busy.setdefault((step - WARMUP_STEPS - 1) // WINDOW_STEPS, []).append(seconds)
                self.gpu_busy_total_s += seconds
                self.gpu_busy_count += 1
                if len(self.gpu_busy) > MAX_WINDOWS:
                    del self.gpu_busy[next(iter(self.gpu_busy))]
        if batch.gpu_steps:
            self.gpu_steps += batch.gpu_steps
            self.gpu_sync_total_s += batch.gpu_sync_s
            self.gpu_late_total_s += batch.gpu_late_s

    def _window_step(self, step_s: float, phases: dict[str, float], sync_phases: tuple[str, ...]) -> None:
        index = (self.steps - WARMUP_STEPS - 1) // WINDOW_STEPS
        if index != self._open_index:
            self._close_window()
            self._open_index = index
        waiting = sum(phases.get(p, 0.0) for p in sync_phases)
        input_stage = sum(phases.get(p, 0.0) for p in INPUT_PHASES)
        self._open.append({**phases, STEP: step_s, OWN: step_s - waiting, INPUT_STAGE: input_stage})

    def _close_window(self) -> None:
        if not self._open:
            return
        self.windows.append((self._open_index, _medians(self._open)))
        self._open = []

    def _phase(self, name: str) -> LogHistogram:
        hist = self.phases.get(name)
        if hist is None:  # a phase first seen late was 0 in every earlier measured step
            hist = self.phases[name] = LogHistogram()
            for _ in range(self.step.count - 1):
                hist.add(0.0)
        return hist

    def summary(self, namer: Callable[[str], str]) -> RankSummary:
        mean_step = self.step.mean
        group_waits: dict[str, float] = {}
        for key, seconds in self.group_wait_s.items():  # two keys may name one group (e.g. the world, dp)
            name = namer(key)
            group_waits[name] = group_waits.get(name, 0.0) + (seconds / self.step_total_s if self.step_total_s else 0.0)
        phases = {
            name: PhaseSummary(
                mean_s=hist.mean,
                p50_s=hist.quantile(0.5),
                p90_s=hist.quantile(0.9),
                share=hist.mean / mean_step if mean_step else 0.0,
            )
            for name, hist in sorted(self.phases.items())
        }
        return RankSummary(
            rank=self.rank,
            steps=self.steps,
            measured_steps=self.step.count,
            step_p50_s=self.step.quantile(0.5),
            step_p90_s=self.step.quantile(0.9),
            step_p99_s=self.step.quantile(0.99),
            step_max_s=self.step.max,
            step_mean_s=mean_step,
            phases=phases,
            sync_phases=tuple(sorted(self.sync_phases & set(phases))),
            gpu_sync_s=self.gpu_sync_total_s / self.gpu_steps if self.gpu_steps else None,
            gpu_late_s=self.gpu_late_total_s / self.gpu_steps if self.gpu_steps else None,
            step_source=self.step_source,
            dropped_batches=self.dropped_batches,
            windows=tuple(self._with_gpu(w) for w in (*self.windows, *self._full_open_window())),
            gpu_busy_s=self.gpu_busy_total_s / self.gpu_busy_count if self.gpu_busy_count else None,
            pipeline=self.pipeline,
            group_waits=group_waits,
        )

    def _with_gpu(self, window: tuple[int, dict[str, float]]) -> tuple[int, Mapping[str, float]]:
        samples = self.gpu_busy.get(window[0])
        if not samples:
            return window
        import statistics

        return window[0], {**window[1], GPU_BUSY: statistics.median(samples)}

    def _full_open_window(self) -> list[tuple[int, dict[str, float]]]:
        """The window in progress, once it has all its steps (the next step has not come yet)."""
        if len(self._open) < WINDOW_STEPS:
            return []
        return [(self._open_index, _medians(self._open))]


def _medians(steps: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over the steps (a phase a step did not have counts 0 there)."""
    import statistics  # once a window is full: not the launcher's start-up time

    return {k: statistics.median(s.get(k, 0.0) for s in steps) for k in sorted(set().union(*steps))}


class Collector:
    def __init__(self, namer: Callable[[str], str] = str) -> None:
        """``namer``: a process group's name from a worker's key (stats/groups.py)."""
        self._namer = namer
        self._ranks: dict[int, _RankStats] = {}
        self._window: dict[int, _RankStats] = {}
        self.bad_datagrams = 0

    def feed(self, data: bytes) -> None:
        batch = wire_check.decode(data)
        if batch is None:
            self.bad_datagrams += 1
            return
        self.add(batch)

    def add(self, batch: wire.Batch) -> None:
        for table in (self._ranks, self._window):
            stats = table.get(batch.rank)
            if stats is None:
                stats = table[batch.rank] = _RankStats(batch.rank)
                if table is self._window and batch.rank in self._ranks:  # past warm-up already
                    stats.steps = max(self._ranks[batch.rank].steps - len(batch.steps), 0)
            stats.add(copy.copy(batch))

    def reset(self) -> None:
        """A new attempt: its statistics start from nothing."""
        self._ranks.clear()
        self._window.clear()

    def summaries(self) -> list[RankSummary]:
        return [self._ranks[r].summary(self._namer) for r in sorted(self._ranks)]

    def window(self) -> list[RankSummary]:
        """Summaries of the steps since the previous call."""
        out = [self._window[r].summary(self._namer) for r in sorted(self._window)]
        self._window = {}
        return out
