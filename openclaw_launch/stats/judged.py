"""One interval's job-wide live verdict as node 0's straggler policy reads it (agents/straggler_policy.py):
stats/job_live.py makes it (``judge_interval``: over the windows since the previous judged interval), the
statistics helper sends it to its launcher (stats/helper.py ``JobJudged``).
A module of its own: the helper's link decodes it by its type hints, and the launcher's start path does
not import the verdict's modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What a straggler's excess_pct is a share of (stats/pipeline.py ``compared_with``): the job's step, or
# a pipeline stage's own work (its step less its waits for the other stages).
PctOf = Literal["step", "own work"]
PCT_OF_STEP: PctOf = "step"
PCT_OF_OWN_WORK: PctOf = "own work"


def excess_text(excess_pct: float, pct_of: str) -> str:
    """A straggler's excess as the live lines and the exclusions say it: a pipeline stage's of its own work."""
    return f"+{excess_pct:.0f} %" + (" of its own work" if pct_of == PCT_OF_OWN_WORK else "")


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
    excess_pct: float = 0.0  # its excess, % of pct_of
    phase: str = ""
    section: str = ""
    pct_of: PctOf = PCT_OF_STEP  # what excess_pct is a share of: the job's step, or a pipeline stage's own work

    @property
    def named(self) -> str:
        excess = excess_text(self.excess_pct, self.pct_of)
        return f"node {self.node} rank {self.rank} ({self.phase}, {self.section}) {excess}"
