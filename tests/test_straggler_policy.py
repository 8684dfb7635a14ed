"""The straggler policy (``--on-straggler``, issue 28), pure: the decision (agents/straggler_policy.py),
its evidence per interval (stats/job_live.py ``judge_interval``) and the rendezvous's guard
(agents/membership.exclusion_refusal). tests/test_straggler_exclude.py runs it."""

from __future__ import annotations

import pytest

from openclaw_launch.agents.membership import ElasticSpec, Member, exclusion_refusal
from openclaw_launch.agents.straggler_policy import Exclude, Note, StragglerSettings, StragglerWatch, Verified
from openclaw_launch.config import defaults
from openclaw_launch.stats.collect import OWN, STEP, PhaseSummary, RankSummary
from openclaw_launch.stats.job_live import LIVE_WINDOWS, NodeInterval, judge, judge_interval
from openclaw_launch.stats.judged import Judged

EXCLUDE = StragglerSettings(policy="exclude", intervals=3, exclude_pct=10.0, cooldown_intervals=5)


def slow(node_rank: int = 1, pct: float = 30.0, attempt: int = 0, step_s: float = 0.12) -> Judged:
    return Judged(attempt, True, step_s, f"node{node_rank}", node_rank, node_rank, pct, "input", "host")


def balanced(attempt: int = 0, step_s: float = 0.09) -> Judged:
    return Judged(attempt, True, step_s)


def test_the_documented_defaults_are_the_settings_defaults() -> None:
    s = StragglerSettings()
    assert (s.policy, s.intervals, s.exclude_pct, s.grace_s, s.cooldown_intervals, s.checkpoint_signal) == (
        defaults.STRAGGLER_POLICY,
        defaults.STRAGGLER_INTERVALS,
        defaults.STRAGGLER_EXCLUDE_PCT,
        defaults.STRAGGLER_GRACE_S,
        defaults.STRAGGLER_COOLDOWN_INTERVALS,
        defaults.CHECKPOINT_SIGNAL,
    )
    assert s.policy == "report" and not s.excludes


def test_report_and_none_never_act() -> None:
    for policy in ("report", "none"):
        watch = StragglerWatch(StragglerSettings(policy=policy))
        assert all(watch.observe(slow()) is None for _ in range(20))


def test_n_consecutive_intervals_above_the_threshold_exclude_the_node_with_the_evidence() -> None:
    watch = StragglerWatch(EXCLUDE)
    actions = [watch.observe(slow(step_s=0.1 + k / 100)) for k in range(3)]
    assert actions[:2] == [None, None]
    decided = actions[2]
    assert isinstance(decided, Exclude) and (decided.node, decided.node_rank, decided.attempt) == ("node1", 1, 0)
    assert len(decided.evidence) == 3 and decided.step_before_s == pytest.approx(0.11)
    assert "3 live intervals in a row" in decided.why and "+30 %" in decided.why


@pytest.mark.parametrize(
    "breaker",
    [balanced(), slow(pct=5.0), slow(node_rank=2), Judged(0, False, 0.1)],
    ids=["balanced", "below-threshold", "another-node", "too-few-steps"],
)
def test_a_flapping_node_is_never_excluded_the_run_must_be_unbroken(breaker: Judged) -> None:
    watch = StragglerWatch(EXCLUDE)
    seen = [watch.observe(j) for j in (slow(), slow(), breaker, slow(), slow(), breaker) * 3]
    assert not any(isinstance(a, Exclude) for a in seen)


def test_a_balanced_job_is_never_touched() -> None:
    watch = StragglerWatch(EXCLUDE)
    assert all(watch.observe(balanced()) is None for _ in range(100))


def test_at_most_one_exclusion_per_cooldown_and_node_0_never() -> None:
    watch = StragglerWatch(EXCLUDE)
    first = [watch.observe(slow()) for _ in range(3)][-1]
    assert isinstance(first, Exclude)
    watch.excluded(first, "node3")
    assert isinstance(watch.observe(slow(node_rank=2, attempt=1)), Verified)  # the next world's first verdict
    later = [watch.observe(slow(node_rank=2, attempt=1)) for _ in range(3)]
    notes = [a for a in later if isinstance(a, Note)]
    assert len(notes) == 1 and "at most one per 5" in notes[0].text  # said once, not every interval
    assert isinstance(watch.observe(slow(node_rank=2, attempt=1)), Exclude)  # 5 intervals after the first
    host = StragglerWatch(EXCLUDE)
    said = [host.observe(slow(node_rank=0)) for _ in range(6)]
    assert [type(a) for a in said if a is not None] == [Note] and "never excluded" in str(said)


def test_the_next_worlds_verdict_verifies_the_replacement_or_warns() -> None:
    watch = StragglerWatch(EXCLUDE)
    decided = [watch.observe(slow()) for _ in range(3)][-1]
    assert isinstance(decided, Exclude)
    watch.excluded(decided, "node3")
    assert watch.observe(slow()) is None  # the old world's last line
    assert watch.observe(Judged(1, False, None)) is None  # too few steps yet
    ok = watch.observe(balanced(attempt=1))
    assert isinstance(ok, Verified) and not ok.named and ok.step_after_s == 0.09
    assert "verified" in ok.text and "a standby holds its node rank 1 (node node3)" in ok.text
    again = StragglerWatch(EXCLUDE)
    decided = [again.observe(slow()) for _ in range(3)][-1]
    assert isinstance(decided, Exclude)
    again.excluded(decided, "node3")
    named = again.observe(Judged(1, True, 0.12, "node3", 1, 1, 25.0, "input", "host"))
    assert isinstance(named, Verified) and named.named and "warning" in named.text


def test_the_rendezvous_refuses_below_min_and_takes_a_standby() -> None:
    spec = ElasticSpec(2, 3, 0)
    standby = [Member(9, "h pid 9", True)]
    assert exclusion_refusal((0, 1, 2), 1, (), (), spec, 3) is None  # 3 -> 2 nodes: MIN kept
    assert "fewer than MIN" in str(exclusion_refusal((0, 1), 1, (), (), spec, 3))
    assert exclusion_refusal((0, 1), 1, (), standby, spec, 3) is None  # the standby keeps the size
    assert "no restart" in str(exclusion_refusal((0, 1, 2), 1, (), (), spec, 0))
    assert "not a node" in str(exclusion_refusal((0, 1, 2), 0, (), (), spec, 3))  # the first node hosts it


def _node(node_rank: int, slow_from: int, windows: int = LIVE_WINDOWS) -> NodeInterval:
    """A node's one rank over ``windows`` windows of a 40 ms step: its own time 10 ms, 30 ms from
    window ``slow_from`` on (the rest of the step waits in ``sync``)."""
    rows = []
    for k in range(windows):
        own_s = (0.03 if k >= slow_from else 0.01) + 1e-4 * (k % 3)
        rows.append((k, {STEP: 0.04, OWN: own_s, "forward": own_s, "sync": 0.04 - own_s}))
    phases = {"forward": PhaseSummary(0.01, 0.01, 0.01, 0.25), "sync": PhaseSummary(0.03, 0.03, 0.03, 0.75)}
    rank = RankSummary(
        node_rank, 200, 150, 0.04, 0.04, 0.04, 0.04, 0.04, phases, ("sync",), None, None, "api", 0, tuple(rows)
    )
    return NodeInterval(f"node{node_rank}", node_rank, 1, (rank,))


def test_the_policys_interval_is_judged_on_its_own_steps_not_the_lines_window() -> None:
    """Node 1 slows down in the last 4 of the 24 windows: the line's verdict (its last 120 steps) does
    not name it yet; the interval since window 19, its steps alone, names it with the whole excess."""
    nodes = [_node(k, 20 if k == 1 else LIVE_WINDOWS) for k in range(3)]
    assert not judge(nodes, 3, [], 5.0).found
    verdict, upto = judge_interval(nodes, 3, [], 5.0, after=19)
    assert verdict is not None and verdict.found and verdict.found[0].node == "node1", verdict
    assert upto == LIVE_WINDOWS - 1 and verdict.found[0].excess_pct > 40 and verdict.step_p50_s == 0.04
    # fewer new windows than the verdict trusts: topped up with the latest before them (21, then 22 and 23 new)
    topped, upto = judge_interval(nodes, 3, [], 5.0, after=LIVE_WINDOWS - 3)
    assert topped is not None and topped.found and topped.found[0].node == "node1" and upto == LIVE_WINDOWS - 1
    # one new slow window, topped up with two before the slowdown: the windows' median is not slow
    onset = [_node(k, LIVE_WINDOWS - 1 if k == 1 else LIVE_WINDOWS) for k in range(3)]
    first = judge_interval(onset, 3, [], 5.0, after=LIVE_WINDOWS - 2)[0]
    assert first is not None and not first.found, first
    # no new window: nothing, and the next interval starts from the same window
    assert judge_interval(nodes, 3, [], 5.0, after=LIVE_WINDOWS - 1) == (None, LIVE_WINDOWS - 1)
