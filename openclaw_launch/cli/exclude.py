"""``run --exclude-file PATH`` (config ``runtime.exclude_file``): where an elastic job adds each node it
takes out for good (agents/exclude_file.py), checked before anything starts (exit 2 naming the
option or the key): a fixed-size job takes no node out, and a path that cannot be written, or a file
there that is no Slurm hostlist, is refused now rather than when the first node is taken out."""

from __future__ import annotations

import click

from openclaw_launch.cli.common import Inputs
from openclaw_launch.cli.run_options import RunOptions
from openclaw_launch.job.agents import ElasticJob


def exclude_file(r: RunOptions, inputs: Inputs, job: ElasticJob | None) -> str | None:
    """The exclude file this job adds to (the option over the config's key), or None."""
    from openclaw_launch.agents.exclude_file import check_exclude_file

    key = inputs.config.runtime.exclude_file if inputs.config is not None else None
    path, name = (r.exclude_file, "--exclude-file") if r.exclude_file else (key, "runtime.exclude_file")
    if path is None:
        return None
    if job is None:
        raise click.BadParameter(
            "needs an elastic job (--nnodes MIN:MAX, or the config's runtime.min_nodes and max_nodes): a fixed-size "
            "job takes no node out",
            param_hint=name,
        )
    problem = check_exclude_file(path)
    if problem is not None:
        raise click.BadParameter(f"{path}: {problem}; give a writable file path", param_hint=name)
    return path
