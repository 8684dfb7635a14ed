"""The live line's default cadence (issue 33): the first within a tick of the first steps, then every
10 s for the first minute, then every 60 s (config/defaults.LIVE_CADENCE_S); ``--stats-interval-s N``
keeps a fixed interval. Counted over a simulated run's timer ticks, as stats/session.py's gate takes
them: no clock in the test."""

from __future__ import annotations

from openclaw_launch.config import defaults


def lines_over(run_s: float, first_steps_s: float) -> list[float]:
    """The times of the live lines of a run whose ranks step from ``first_steps_s`` on: the timer ticks
    every LIVE_TICK_S; a tick prints when due and there are steps (the session's rule)."""
    printed: list[float] = []
    next_s = 0.0
    tick = defaults.LIVE_TICK_S
    t = tick
    while t <= run_s:
        if t >= next_s and t >= first_steps_s:
            printed.append(t)
            next_s = t + defaults.live_gap_s(t - printed[0]) - tick / 2
        t += tick
    return printed


def test_the_first_line_comes_within_a_tick_of_the_first_steps() -> None:
    for first_steps_s in (0.5, 9.0, 13.0, 47.0):
        first = lines_over(600, first_steps_s)[0]
        assert first_steps_s <= first < first_steps_s + defaults.LIVE_TICK_S <= 10.0 + first_steps_s


def test_every_10_s_for_a_minute_then_every_60_s() -> None:
    lines = lines_over(600, 0.5)
    gaps = [b - a for a, b in zip(lines, lines[1:], strict=False)]
    assert gaps[:6] == [10.0] * 6 and set(gaps[6:]) == {60.0}
    assert len(lines) == 15  # a 10-minute run: 7 in its first minute of lines, then one a minute; 60 s gave 10
    assert defaults.STATS_INTERVAL_S is None  # the cadence is the default; a number keeps a fixed interval


def test_a_long_run_is_not_noisy() -> None:
    hours = 24
    assert len(lines_over(hours * 3600, 1.0)) < hours * 60 + 10  # about one a minute
