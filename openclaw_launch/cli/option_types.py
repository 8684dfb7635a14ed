"""Click types for the launcher's numeric options, bounded by ``limits`` (one definition per bound),
and for its signal lists (``config/signals.py``'s parser).

``click.FloatRange(min=0)`` takes ``nan`` and ``inf`` (every comparison with nan is false); these
do not, and their message names the accepted range. Every duration option (and its environment
variable) is ``seconds(lo)``: ``limits.seconds_problem`` is the rule, as for the config's durations.
"""

from __future__ import annotations

import math
from typing import Any

import click

from openclaw_launch.config.signals import parse_signals
from openclaw_launch.limits import (
    MAX_PERCENT,
    MAX_RESTARTS,
    MAX_SECONDS,
    MAX_WORLD_SIZE,
    MIN_HANG_TIMEOUT_S,
    seconds_problem,
)


class _FiniteRange(click.FloatRange):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a number in the range {self._describe_range()}.", param, ctx)
        return rv


class _Seconds(click.FloatRange):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds.", param, ctx)
        problem = seconds_problem(number, self.min or 0.0)
        if problem is not None:
            self.fail(problem, param, ctx)
        return number


def seconds(lo: float = 0.0) -> click.FloatRange:
    """A duration: ``lo`` .. MAX_SECONDS (a week)."""
    return _Seconds(lo, MAX_SECONDS)


def hang_timeout() -> click.FloatRange:
    """--hang-timeout-s: MIN_HANG_TIMEOUT_S .. a week (runtime.hang_timeout_s has the same bounds)."""
    return seconds(MIN_HANG_TIMEOUT_S)


def percent() -> click.FloatRange:
    return _FiniteRange(0, MAX_PERCENT)


def slow_percent() -> click.FloatRange:
    """``preflight --slow-pct``: above 0 and below 100 (0 would flag every GPU, 100 none)."""
    return _FiniteRange(0, 100, min_open=True, max_open=True)


def restarts() -> click.IntRange:
    return click.IntRange(0, MAX_RESTARTS)


def node_rank() -> click.IntRange:
    return click.IntRange(0, MAX_WORLD_SIZE - 1)


class _SignalList(click.ParamType):
    """A comma-separated signal list -> canonical names; the message lists the valid names."""

    name = "signals"

    def __init__(self, allow_none: bool) -> None:
        self.allow_none = allow_none

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):  # already converted (a default given as names)
            return value
        try:
            return parse_signals(str(value), self.allow_none)
        except ValueError as e:
            self.fail(str(e), param, ctx)


def signal_list(allow_none: bool = False) -> click.ParamType:
    """``--signals-to-handle``; ``allow_none``: ``none`` means no signal (``--forward-signals``)."""
    return _SignalList(allow_none)
