"""The verdict's and the step imbalance's "median of the other ranks", computed for every rank from one
sort (stats/median.py), is the same float as the straightforward definition (each rank's others
sorted on their own, ``statistics.median``) on random inputs: ties, even and odd counts, 2 and 3
ranks, too few common windows (the means), GPU samples on some windows only."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

import pytest

from openclaw_launch.stats.collect import GPU_BUSY, INPUT_STAGE, OWN, PhaseSummary, RankSummary
from openclaw_launch.stats.imbalance import _Tally, _tally_step
from openclaw_launch.stats.median import medians_of_others
from openclaw_launch.stats.verdict import MIN_WINDOWS, Excess, _mean, excesses

SEEDS = range(40)
KEYS = (OWN, INPUT_STAGE, GPU_BUSY, "forward", "input")


def _others_median(values: Sequence[float], i: int) -> float:
    """The straightforward definition: the others, sorted on their own."""
    return statistics.median([v for j, v in enumerate(values) if j != i])


def _draw(rng: random.Random, n: int) -> list[float]:
    """``n`` values: continuous, or from a few levels (ties), or all equal."""
    kind = rng.randrange(3)
    if kind == 0:
        return [rng.uniform(0.0, 0.05) for _ in range(n)]
    if kind == 1:
        levels = [rng.uniform(0.0, 0.05) for _ in range(rng.randint(1, 3))]
        return [rng.choice(levels) for _ in range(n)]
    return [0.01] * n


@pytest.mark.parametrize("seed", SEEDS)
def test_every_values_median_of_the_others_is_the_straightforward_one(seed: int) -> None:
    rng = random.Random(seed)
    for n in (2, 3, 4, 5, rng.randint(6, 40), rng.randint(6, 40)):
        values = _draw(rng, n)
        assert medians_of_others(values) == [_others_median(values, i) for i in range(n)], values


def test_one_value_has_no_others() -> None:
    with pytest.raises(ValueError, match="at least 2 values"):
        medians_of_others([1.0])


def _rank(rng: random.Random, rank: int, windows: Sequence[int], levels: Sequence[float]) -> RankSummary:
    """A rank with random window values (from ``levels``: ties across ranks), a phase some windows
    lack, GPU samples on some windows, and means for the too-few-windows case."""
    rows = []
    for k in windows:
        row = {OWN: rng.choice(levels), INPUT_STAGE: rng.choice(levels), "forward": rng.choice(levels)}
        if rng.random() < 0.7:
            row["input"] = rng.choice(levels)
        if rng.random() < 0.8:
            row[GPU_BUSY] = rng.choice(levels)
        rows.append((k, row))
    phases = {name: PhaseSummary(rng.choice(levels), 0.0, 0.0, 0.0) for name in ("forward", "input", "sync")}
    step_s = 0.1
    gpu_busy = rng.choice(levels) if rng.random() < 0.8 else None
    return RankSummary(
        rank, 100, 90, step_s, step_s, step_s, step_s, step_s, phases, ("sync",), None, None, "optimizer", 0,
        tuple(rows), gpu_busy,
    )  # fmt: skip


def _straightforward_excess(rank: RankSummary, others: Sequence[RankSummary], key: str) -> Excess:
    """The verdict's excess as defined, one rank at a time: per common window, its value minus the
    median of the others' (each window's others sorted anew), then the median of those differences
    and its standard error; under ``MIN_WINDOWS`` common windows, the means."""
    by_window = [dict(r.windows) for r in (rank, *others)]
    common = sorted(set.intersection(*(set(w) for w in by_window)))
    if key == GPU_BUSY:
        common = [k for k in common if all(key in w[k] for w in by_window)]
    if len(common) < MIN_WINDOWS:
        return Excess(_mean(rank, key) - statistics.median(_mean(o, key) for o in others), 0.0)
    mine, theirs = by_window[0], by_window[1:]
    diffs = [mine[k].get(key, 0.0) - statistics.median(w[k].get(key, 0.0) for w in theirs) for k in common]
    middle = statistics.median(diffs)
    spread_s = 1.4826 * statistics.median(abs(d - middle) for d in diffs)
    return Excess(middle, 1.253 * spread_s / len(diffs) ** 0.5)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_ranks_excess_is_the_straightforward_one(seed: int) -> None:
    rng = random.Random(seed)
    n = (2, 3, 4, 5)[seed % 4] if seed < 20 else rng.randint(6, 24)
    levels = [rng.uniform(0.001, 0.05) for _ in range(rng.choice((2, 3, 50)))]
    windows = list(range(rng.choice((2, 3, 12))))  # 2: under MIN_WINDOWS, the means
    ranks = [_rank(rng, r, [k for k in windows if rng.random() < 0.9], levels) for r in range(n)]
    for key in KEYS:
        got = excesses(ranks, key)
        for r in ranks:
            want = _straightforward_excess(r, [o for o in ranks if o is not r], key)
            assert got[r.rank] == want, (key, r.rank)


def _straightforward_tally(works: dict[int, float]) -> tuple[int, float, dict[int, float]]:
    slowest = max(sorted(works), key=works.__getitem__)
    values = list(works.values())
    excess = {rank: work - _others_median(values, i) for i, (rank, work) in enumerate(works.items())}
    return slowest, _others_median(values, list(works).index(slowest)), excess


@pytest.mark.parametrize("seed", SEEDS)
def test_each_steps_excesses_are_the_straightforward_ones(seed: int) -> None:
    """The step imbalance's tally (stats/imbalance.py): per step, the slowest rank, its work over the
    others' median, and each rank's excess summed and squared, exactly as one rank at a time."""
    rng = random.Random(seed)
    n = (2, 3)[seed % 2] if seed < 10 else rng.randint(4, 30)
    tally = _Tally()
    slowest: dict[int, int] = {}
    total, cost, sums, squares = 0.0, 0.0, dict.fromkeys(range(n), 0.0), dict.fromkeys(range(n), 0.0)
    for _ in range(25):
        ranks = list(range(n))
        rng.shuffle(ranks)  # the order the ranks' steps arrived in
        works = dict(zip(ranks, _draw(rng, n), strict=True))
        _tally_step(tally, works)
        top, median_work, excess = _straightforward_tally(works)
        slowest[top] = slowest.get(top, 0) + 1
        total += median_work
        cost += works[top] - median_work
        for rank in works:
            sums[rank] += excess[rank]
            squares[rank] += excess[rank] * excess[rank]
    assert (tally.slowest, tally.work_total_s, tally.cost.total) == (slowest, total, cost)
    assert (tally.excess_sum_s, tally.excess_sq_s2) == (sums, squares)
