"""One interval's job-wide live verdict as node 0's straggler policy reads it (agents/straggler_policy.py):
stats/job_live.py makes it (``judge_interval``: over the windows since the previous judged interval), the
statistics helper sends it to its launcher (stats/helper.py ``JobJudged``).
A module of its own: the helper's link decodes it by its type hints, and the launcher's start path does
not import the verdict's modules."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Judged:
    """One interval's job-wide verdict as node 0's straggler policy reads it (agents/straggler_policy.py),
    sent by the helper to its launcher every interval (stats/helper.py ``JobJudged``)."""

    attempt: int  # the world it judged (the job's attempt)
    judged: bool  # judged: the interval's own steps (False: the attempt has too few steps yet)
    step_p50_s: float | None  # the job's median step in the interval (None: no measured step yet)
    node: str = ""  # the straggler's node ("": none named)
    node_rank: int = -1
    rank: int = -1
    excess_pct: float = 0.0  # its excess, % of the job's step
    phase: str = ""
    section: str = ""

    @property
    def named(self) -> str:
        return f"node {self.node} rank {self.rank} ({self.phase}, {self.section}) +{self.excess_pct:.0f} %"
