"""The one phase accounting: which measured phase is input, work or waiting, and how a rank's step
splits into the three. The table (report/format.py), the plot (report/plot.py), the verdict
(stats/verdict.py) and the report's shares (report/build.py) all use it, so they cannot disagree.

- **input** (the input/host stage): ``input`` (the DataLoader, ``section("data")``) and ``host``
  (the rest of the step before its first work: batches sliced in the loop, copies, logging);
- **wait**: the time a rank waited for the others, ``wait_s``: its wait signal (the phases that
  contain waiting: ``sync`` sections, blocking collectives, ``backward`` when DDP's all-reduce blocks
  the host, ``device-wait`` under NCCL; or the flight recorder) minus the least any rank shows;
- **work**: the rest of the step, the wait phases' own part (the collectives' cost every rank pays,
  backward's compute) included.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from openclaw_launch.telemetry import wire

INPUT_PHASES = (wire.INPUT, wire.HOST)
INPUT, WORK, WAIT = "input", "work", "wait"
# The verdict's section for a rank slow in its GPU work (CUDA events on sampled steps, or the
# flight recorder's wait): work, timed on the GPU rather than by a CPU phase.
GPU_WORK = "gpu"


def kind(phase: str, sync_phases: Collection[str]) -> str:
    """``input``, ``wait`` (a phase that contains waiting for other ranks) or ``work``."""
    if phase in INPUT_PHASES:
        return INPUT
    return WAIT if phase in sync_phases else WORK


@dataclass(frozen=True)
class StepSplit:
    """Per step, seconds: input + work + wait = the step."""

    input_s: float
    work_s: float
    wait_s: float

    def shares(self) -> tuple[float, float, float]:
        total = self.input_s + self.work_s + self.wait_s
        if total <= 0:
            return 0.0, 0.0, 0.0
        return self.input_s / total, self.work_s / total, self.wait_s / total


def split(step_s: float, phases_s: Mapping[str, float], waited_s: float) -> StepSplit:
    """A rank's mean step as input / work / wait: ``phases_s`` its mean time per phase, ``waited_s``
    the time it waited for the others (``waited_for_others``), capped at what is left of the step."""
    input_s = min(sum(phases_s.get(p, 0.0) for p in INPUT_PHASES), max(step_s, 0.0))
    wait_s = min(max(waited_s, 0.0), max(step_s - input_s, 0.0))
    return StepSplit(input_s=input_s, work_s=max(step_s - input_s - wait_s, 0.0), wait_s=wait_s)
