"""``--on-straggler`` and its knobs (config ``runtime.straggler_*``, ``runtime.checkpoint_signal``):
each option over its config key over config/defaults.py's default, checked before anything starts
(``run`` and ``plan`` alike). ``exclude`` needs a job that can take a node out: an elastic one
(``--nnodes MIN:MAX`` with MIN < MAX, or the config's min_nodes/max_nodes), a restart for each
re-forming, and the job-wide live verdict (telemetry on, live intervals); else exit 2 naming the
option or the key."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import click

from openclaw_launch.agents.straggler_policy import StragglerSettings
from openclaw_launch.cli.run_options import RunOptions
from openclaw_launch.config import defaults

if TYPE_CHECKING:
    from openclaw_launch.config.model import Runtime
    from openclaw_launch.job.agents import ElasticJob

T = TypeVar("T")


def straggler_settings(
    r: RunOptions, runtime: Runtime | None, job: ElasticJob | None, max_restarts: int
) -> StragglerSettings:
    """The policy in force (``runtime``: the config's, None without one); ``exclude`` where the job
    cannot exclude is a usage error (exit 2)."""
    from openclaw_launch.config.model import Runtime

    rt = runtime or Runtime()
    signal = r.checkpoint_signal or ((rt.checkpoint_signal,) if rt.checkpoint_signal else (defaults.CHECKPOINT_SIGNAL,))
    if len(signal) != 1:
        raise click.BadParameter(f"give one signal, not {', '.join(signal)}", param_hint="--checkpoint-signal")
    settings = StragglerSettings(
        policy=_first(r.on_straggler, rt.straggler_policy, defaults.STRAGGLER_POLICY),
        intervals=_first(r.straggler_intervals, rt.straggler_intervals, defaults.STRAGGLER_INTERVALS),
        exclude_pct=_first(r.straggler_exclude_pct, rt.straggler_exclude_pct, defaults.STRAGGLER_EXCLUDE_PCT),
        grace_s=_first(r.straggler_grace_s, rt.straggler_grace_s, defaults.STRAGGLER_GRACE_S),
        cooldown_intervals=_first(
            r.straggler_cooldown_intervals, rt.straggler_cooldown_intervals, defaults.STRAGGLER_COOLDOWN_INTERVALS
        ),
        checkpoint_signal=signal[0],
    )
    if settings.excludes:
        why = _cannot_exclude(r, job, max_restarts)
        if why is not None:
            where = "--on-straggler" if r.on_straggler is not None else "runtime.straggler_policy"
            raise click.BadParameter(f"exclude {why}; started nothing", param_hint=where)
    return settings


def _cannot_exclude(r: RunOptions, job: ElasticJob | None, max_restarts: int) -> str | None:
    if job is None:
        return (
            "takes the straggler's node out of an elastic job, and this job is not one: give --nnodes MIN:MAX "
            "with MIN < MAX (N:N is a fixed-size job) and --rdzv-backend c10d, or the config's runtime.min_nodes "
            "and max_nodes, with a standby (--standby) to keep the world's size; or use report"
        )
    if max_restarts < 1:
        return "re-forms the world, which takes a restart: give --max-restarts 1 or more"
    if r.telemetry == "off" or r.stats_interval_s == 0:
        return (
            "acts on the job-wide live verdict: it needs --telemetry other than off and --stats-interval-s other than 0"
        )
    return None


def _first(given: T | None, configured: T | None, default: T) -> T:
    """The option, else the config's key, else the default."""
    return given if given is not None else configured if configured is not None else default
