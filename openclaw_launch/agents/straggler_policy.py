"""The straggler policy (``--on-straggler``), pure: what node 0 does with the job-wide live verdict.

Node 0's statistics helper judges every node's ranks at each live interval (stats/job_live.py); the
elastic agent (agents/elastic_agent.py) hands each judgement to ``StragglerWatch.observe`` and carries
out what it answers (the checkpoint request, the re-formed world without the node, the exclude file).
The rules, with their defaults in config/defaults.py:

- ``none`` and ``report`` never act (``report`` is the job's line on node 0, as before).
- ``exclude`` takes a node out only when the verdict named it the job's straggler in ``intervals``
  consecutive judged intervals (never fewer than two: ``limits.MIN_STRAGGLER_INTERVALS``), each time
  with an excess of at least ``exclude_pct`` % of the job's step (a pipeline stage's: of its own work,
  as the verdict's ``excess_pct``). Each judged interval brings new
  evidence: the verdict over the windows of 5 steps since the previous one (stats/job_live.py
  ``judge_interval``: at least one new window, topped up with the latest earlier ones to the 3 the
  verdict needs), not the live line's last 120 steps; N intervals in a row span at least N + 2
  windows. An interval that names nobody (a balanced job), another node, a smaller excess, or whose
  attempt has too few steps breaks the run.
- At most one exclusion per ``cooldown_intervals`` intervals (counted from the last one decided).
- Node 0 hosts the rendezvous and is never taken out (said once per run of intervals).
- MIN (and a standby to take the node's place) is the rendezvous's to check (agents/elastic.py): it
  refuses an exclusion that would leave fewer than MIN nodes.
- After an exclusion the first judged interval of the re-formed world verifies it: the verdict must
  not name the node that took the excluded one's rank (``Verified.named``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from openclaw_launch.config import defaults
from openclaw_launch.stats.judged import PCT_OF_STEP, Judged, excess_text


@dataclass(frozen=True)
class StragglerSettings:
    """``--on-straggler`` and its knobs (config ``runtime.straggler_*``, ``runtime.checkpoint_signal``)."""

    policy: str = defaults.STRAGGLER_POLICY
    intervals: int = defaults.STRAGGLER_INTERVALS
    exclude_pct: float = defaults.STRAGGLER_EXCLUDE_PCT
    grace_s: float = defaults.STRAGGLER_GRACE_S
    cooldown_intervals: int = defaults.STRAGGLER_COOLDOWN_INTERVALS
    checkpoint_signal: str = defaults.CHECKPOINT_SIGNAL

    @property
    def excludes(self) -> bool:
        return self.policy == "exclude"


@dataclass(frozen=True)
class Exclude:
    """Take ``node`` (node rank ``node_rank`` of world ``attempt``) out: the evidence, the step before."""

    node: str
    node_rank: int
    attempt: int
    evidence: tuple[Judged, ...]
    step_before_s: float | None

    @property
    def why(self) -> str:
        last = self.evidence[-1]
        pcts = ", ".join(excess_text(j.excess_pct, j.pct_of) for j in self.evidence)
        if last.pct_of == PCT_OF_STEP:
            pcts += " of the step"
        return (
            f"the job's straggler in {len(self.evidence)} live intervals in a row ({pcts}; "
            f"{last.phase}, {last.section})"
        )


@dataclass(frozen=True)
class Verified:
    """The re-formed world's first judged interval after an exclusion."""

    excluded: Exclude
    replacement: str  # the node that took the excluded node's rank ("": the world shrank)
    step_after_s: float | None
    named: bool  # the verdict named the replacement: the exclusion did not cure the job
    verdict: str  # what the interval said

    @property
    def text(self) -> str:
        rank = self.excluded.node_rank
        took = (
            f"a standby holds its node rank {rank} (node {self.replacement})" if self.replacement else "a smaller world"
        )
        before, after = _ms(self.excluded.step_before_s), _ms(self.step_after_s)
        head = f"after excluding node {self.excluded.node}: {took}, step p50 {before} before, {after} now"
        if self.named:
            return f"{head}; warning: the verdict names the replacement ({self.verdict})"
        return f"{head}; verified: the verdict does not name the replacement ({self.verdict})"


@dataclass(frozen=True)
class Note:
    """A line, once: why a straggler named often enough is not taken out."""

    text: str


Action = Exclude | Verified | Note


@dataclass
class StragglerWatch:
    """Node 0's running count over the live intervals (one per ``observe``), across worlds."""

    settings: StragglerSettings
    intervals_seen: int = 0
    _run: list[Judged] = field(default_factory=list)
    _last_exclusion_at: int | None = None  # intervals_seen when the last exclusion was decided
    _pending: Exclude | None = None  # decided, its world not yet verified
    _replacement: str = ""
    _noted: bool = False  # the current run of intervals got its Note

    def observe(self, judged: Judged) -> Action | None:
        """One interval's verdict: what to do now, if anything."""
        self.intervals_seen += 1
        if not self.settings.excludes:
            return None
        if self._pending is not None:
            return self._verify(judged)
        if not self._counts(judged):
            self._run, self._noted = [], False
            return None
        if self._run and (self._run[-1].node_rank, self._run[-1].attempt) != (judged.node_rank, judged.attempt):
            self._run, self._noted = [], False
        self._run.append(judged)
        if len(self._run) < self.settings.intervals:
            return None
        return self._decide()

    @property
    def in_a_row(self) -> int:
        """Judged intervals in a row that named the same node (the current run's count)."""
        return len(self._run)

    def excluded(self, exclude: Exclude, replacement: str) -> None:
        """The world re-formed without ``exclude.node``: ``replacement`` holds its rank ("": none)."""
        self._pending, self._replacement = exclude, replacement

    def refused(self) -> None:
        """The rendezvous refused the exclusion (MIN, no restart left): the count starts again."""
        self._run, self._noted = [], False

    def _counts(self, judged: Judged) -> bool:
        return judged.judged and bool(judged.node) and judged.excess_pct >= self.settings.exclude_pct

    def _decide(self) -> Action | None:
        last = self._run[-1]
        if last.node_rank == 0:
            return self._note(f"node {last.node} (node rank 0) hosts the rendezvous: it is never excluded")
        since = None if self._last_exclusion_at is None else self.intervals_seen - self._last_exclusion_at
        if since is not None and since < self.settings.cooldown_intervals:
            return self._note(
                f"node {last.node} is the job's straggler, but the last exclusion was {since} interval(s) ago: at "
                f"most one per {self.settings.cooldown_intervals} (--straggler-cooldown-intervals)"
            )
        evidence = tuple(self._run)
        self._run, self._noted = [], False
        self._last_exclusion_at = self.intervals_seen
        before = _median([j.step_p50_s for j in evidence])
        return Exclude(last.node, last.node_rank, last.attempt, evidence, before)

    def _note(self, text: str) -> Note | None:
        if self._noted:
            return None
        self._noted = True
        return Note(text)

    def _verify(self, judged: Judged) -> Verified | None:
        pending = self._pending
        assert pending is not None
        if judged.attempt <= pending.attempt or not judged.judged:
            return None  # the old world's last lines, or the new one's too few steps
        self._pending = None
        named = bool(self._replacement) and judged.node == self._replacement
        verdict = f"straggler: {judged.named}" if judged.node else "no straggler"
        return Verified(pending, self._replacement, judged.step_p50_s, named, verdict)


def _median(values: Sequence[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def _ms(seconds: float | None) -> str:
    return "unknown" if seconds is None else f"{1000 * seconds:.1f} ms"
