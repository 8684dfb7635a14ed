"""Click types for the launcher's numeric options, bounded by ``limits`` (one definition per bound).

``click.FloatRange(min=0)`` takes ``nan`` and ``inf`` (every comparison with nan is false); these
do not, and their message names the accepted range.
"""

from __future__ import annotations

import math
from typing import Any

import click

from openclaw_launch.config.limits import MAX_PERCENT, MAX_RESTARTS, MAX_SECONDS, MAX_WORLD_SIZE, MIN_HANG_TIMEOUT_S


class _FiniteRange(click.FloatRange):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a number in the range {self._describe_range()}.", param, ctx)
        return rv


def seconds() -> click.FloatRange:
    """A duration: 0 .. a week."""
    return _FiniteRange(0, MAX_SECONDS)


def hang_timeout() -> click.FloatRange:
    """--hang-timeout-s: MIN_HANG_TIMEOUT_S .. a week (runtime.hang_timeout_s has the same bounds)."""
    return _FiniteRange(MIN_HANG_TIMEOUT_S, MAX_SECONDS)


def percent() -> click.FloatRange:
    return _FiniteRange(0, MAX_PERCENT)


def restarts() -> click.IntRange:
    return click.IntRange(0, MAX_RESTARTS)


def node_rank() -> click.IntRange:
    return click.IntRange(0, MAX_WORLD_SIZE - 1)
