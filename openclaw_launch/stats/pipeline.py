"""Pipeline stages in the verdict (stats/verdict.py): which ranks are stages, what a stage's excess
is a share of, and the finding of the stage that bounds the pipeline.

A stage's step is not all its own work: it also waits in the point-to-point calls (``p2p``) for the
other stages' activations and gradients, the fill and drain of the pipeline (the bubble: about
(S-1)/(M+S-1) of the step with S stages and M micro-batches under 1F1B) included. What sets the
pipeline's pace, and what moving layers changes, is a stage's own work (its step less those waits)
against the other stages'. So for stages the verdict's one threshold rule (``slowdown_floor_s``: the
excess that makes the time compared ``threshold_pct`` % longer than the others') takes the stage's
own work as that time, not the step: a stage is named from 4.5 % more own work than the other
stages' median at the default 5 %, as a DDP rank is named from 4.5 % of the step. Measured against
the step instead, a stage with 5 % more work than the others reads as 5 % of its own share of the
step (2 stages, 4 micro-batches: about 80 %, so 4 %), under the 4.3 % of the step that names a rank.
Every other rank (DDP, FSDP, TP: all wait in collectives that end together) keeps the step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from openclaw_launch.stats.collect import RankSummary
from openclaw_launch.stats.judged import PCT_OF_OWN_WORK, PCT_OF_STEP, PctOf
from openclaw_launch.telemetry import wire


def is_pipeline(ranks: Sequence[RankSummary]) -> bool:
    """Every rank a pipeline stage: its waiting is in point-to-point calls (``p2p``: the stages'
    activations and gradients), or torch's pipelining schedule said which stage it runs."""
    return bool(ranks) and all(r.pipeline is not None or r.phase_mean(wire.P2P) > 0 for r in ranks)


def compared_with(stages: bool, step_s: float, own_s: float) -> tuple[PctOf, float]:
    """What a rank's excess is a share of (``Straggler.pct_of``) and that time per step: a pipeline
    stage's own work (``own_s``, when the ranks are ``stages`` and it has any), else the job's step."""
    if stages and own_s > 0:
        return PCT_OF_OWN_WORK, own_s
    return PCT_OF_STEP, step_s


def hint(slow: RankSummary, judged: Sequence[RankSummary]) -> list[str]:
    """The stage that bounds the pipeline: every other stage waits for its activations or its
    gradients, and it waits only in the pipeline's fill and drain (the bubble). Its own work's share
    of the step, the bubble's, and the share of its layers that moving to the other stages would
    balance them (its own work down to the stages' mean)."""
    if not is_pipeline(judged) or slow.step_mean_s <= 0:
        return []
    own = {r.rank: max(r.step_mean_s - r.wait_s, 0.0) for r in judged}
    mine = own[slow.rank]
    if mine <= 0:
        return []
    stage = f"stage {slow.pipeline[0]} of {slow.pipeline[1]}" if slow.pipeline else "its pipeline stage"
    bubble = min(slow.wait_s / slow.step_mean_s, 1.0)
    move = 1 - statistics.mean(own.values()) / mine
    share = 100 * mine / slow.step_mean_s
    peers = 100 * statistics.median(own[r.rank] for r in judged if r is not slow) / slow.step_mean_s
    return [
        f"pipeline: rank {slow.rank}, {stage}, bounds the pipeline: its own work is {share:.0f} % of the step "
        f"(the other stages' median {peers:.0f} %), the bubble (its waiting in the pipeline's fill and drain) "
        f"{100 * bubble:.0f} %; moving about {100 * move:.0f} % of its layers to the other stages would balance them"
    ]
