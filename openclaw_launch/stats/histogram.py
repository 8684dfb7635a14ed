"""Bounded-memory distributions: log-spaced buckets, so a week-long job costs what a minute does."""

from __future__ import annotations

import math

_RATIO = 1.02  # bucket width: quantiles are within 1 % of the true value
_LOG_RATIO = math.log(_RATIO)
_FLOOR_S = 1e-7  # below this everything is one bucket


class LogHistogram:
    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.total = 0.0
        self.max = 0.0

    def add(self, value: float) -> None:
        index = -1 if value <= _FLOOR_S else int(math.log(value / _FLOOR_S) / _LOG_RATIO)
        self._buckets[index] = self._buckets.get(index, 0) + 1
        self.count += 1
        self.total += value
        self.max = max(self.max, value)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The q-quantile (0 <= q <= 1), as the geometric middle of its bucket; 0 when empty."""
        if not self.count:
            return 0.0
        rank = q * (self.count - 1)
        seen = 0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen > rank:
                if index < 0:
                    return 0.0
                return min(_FLOOR_S * _RATIO ** (index + 0.5), self.max)
        return self.max
