"""Every value's median of the others, all at once: the verdict's and the step imbalance's comparison
of each rank with the median of all the other ranks (stats/verdict.py, stats/imbalance.py).

Taken one rank at a time, that median sorts the other n - 1 values for each of n ranks: O(n² log n)
a window (the verdict at 1 024 ranks of 24 windows: 9.2 s of CPU, benchmarks/RESULTS.md). Sorted once,
the others' median is one of three neighbours of the middle of the sorted values, picked by where the
rank's own value falls: O(n log n) in all (0.09 s). The result is the same float as
``statistics.median`` of the others (the same two values added and halved), so no verdict changes;
equal values are interchangeable, as the others are the same multiset whichever of them is left out.
"""

from __future__ import annotations

from collections.abc import Sequence


def medians_of_others(values: Sequence[float]) -> list[float]:
    """For each of ``values`` (at least two), the median of all the others, in the same order."""
    n = len(values)
    if n < 2:
        raise ValueError(f"the median of the others needs at least 2 values, got {n}")
    ordered = sorted(values)
    half = (n - 1) // 2  # the others' middle (n - 1 values; with n odd, its upper one)
    if n % 2 == 0:  # n - 1 others, an odd count: their middle value
        below, above = ordered[half], ordered[half + 1]
        # a value above ordered[half] leaves it in place; one at or below it shifts the middle up one
        return [below if ordered[half] < v else above for v in values]
    # n - 1 others, an even count: the mean of their two middle values
    low = (ordered[half] + ordered[half + 1]) / 2  # the value left out is at or below ordered[half - 1]
    mid = (ordered[half - 1] + ordered[half + 1]) / 2  # it is ordered[half] itself (first of its equals)
    high = (ordered[half - 1] + ordered[half]) / 2  # it is above ordered[half]
    out = []
    for v in values:
        if ordered[half] < v:
            out.append(high)
        elif ordered[half - 1] < v:  # == ordered[half]: its first occurrence is at ``half``
            out.append(mid)
        else:
            out.append(low)
    return out
