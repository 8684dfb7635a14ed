"""``--replica-groups K`` (``runtime.replica_groups``) on the command line: torchft found, the layout
checked (exit 2 with one line before anything starts), each group's run facts and ports, then the
pure cut (plan/replica_groups.py), which ``run`` and ``plan`` print and ``run`` starts alike."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from typing import TYPE_CHECKING

import click

from openclaw_launch.cli.common import Common, Inputs
from openclaw_launch.cli.run_options import RunOptions
from openclaw_launch.config.defaults import LIGHTHOUSES
from openclaw_launch.plan.context import FREE_PORT, free_port, run_context
from openclaw_launch.plan.env import worker_python
from openclaw_launch.plan.replica_groups import (
    INSTALL_HINT,
    LIGHTHOUSE_COMMAND,
    OPENCLAW_LIGHTHOUSE_MODULE,
    ReplicaGroupsPlan,
    plan_replica_groups,
    replica_groups_problem,
)

MAX_PORT = 65535

if TYPE_CHECKING:
    from openclaw_launch.config.model import Config
    from openclaw_launch.plan.model import LaunchPlan


def lighthouse_command(environ: dict[str, str] | os._Environ[str]) -> str | None:
    """torchft's ``torchft_lighthouse``: beside the workers' Python (its environment's scripts), else
    on PATH; None: torchft is not installed."""
    here = os.path.dirname(worker_python(environ))
    search = os.pathsep.join(p for p in (here, environ.get("PATH", os.defpath)) if p)
    return shutil.which(LIGHTHOUSE_COMMAND, path=search)


def asked(r: RunOptions, inputs: Inputs) -> int | None:
    """K of ``--replica-groups K``, else of the config's ``runtime.replica_groups``; None: none."""
    if r.replica_groups is not None:
        return r.replica_groups
    return inputs.config.runtime.replica_groups if inputs.config is not None else None


def openclaw_lighthouse_runs() -> bool:
    """Whether this Python can run openclaw's lighthouse: grpcio (its gRPC) and protobuf (its messages)
    importable (found, not imported: the launcher's start stays light)."""
    return all(importlib.util.find_spec(name) is not None for name in ("grpc", "google.protobuf"))


def lighthouse_kind(r: RunOptions, inputs: Inputs) -> str:
    """Whose lighthouse: ``--lighthouse``, else ``runtime.lighthouse``, else openclaw's where this
    Python can run it, else torchft's."""
    given = r.lighthouse or (inputs.config.runtime.lighthouse if inputs.config is not None else None)
    if given is not None:
        return given
    return LIGHTHOUSES[0] if openclaw_lighthouse_runs() else LIGHTHOUSES[1]


def check_before_meeting(r: RunOptions, inputs: Inputs, elastic: bool) -> None:
    """What refuses replica groups before the nodes would meet (``run`` meets an elastic or
    by-arrival job's nodes before it plans): torchft missing, K < 1, elastic, several nodes."""
    groups = asked(r, inputs)
    if groups is None:
        return
    if lighthouse_command(os.environ) is None:
        raise click.BadParameter(
            f"needs torchft, whose lighthouse ({LIGHTHOUSE_COMMAND}) is not installed beside the workers' Python nor "
            f"on PATH: {INSTALL_HINT}",
            param_hint="--replica-groups",
        )
    if lighthouse_kind(r, inputs) == "openclaw" and not openclaw_lighthouse_runs():
        raise click.BadParameter(
            f"openclaw's lighthouse needs grpcio and protobuf, which this Python ({sys.executable}) cannot import: "
            "pip install 'openclaw-launch[torchft]' (or: pip install grpcio protobuf), or give --lighthouse torchft",
            param_hint="--lighthouse (runtime.lighthouse)",
        )
    nnodes = len(inputs.config.nodes) if inputs.config is not None else inputs.want.nnodes or 1
    # the node's ranks are known once the plan is built: K dividing them is checked then
    problem = replica_groups_problem(groups, groups, nnodes, elastic or inputs.want.elastic is not None)
    if problem is not None:
        raise click.BadParameter(problem, param_hint="--replica-groups")


def replica_groups(
    c: Common, inputs: Inputs, r: RunOptions, plan: LaunchPlan, config: Config, *, at_run: bool
) -> ReplicaGroupsPlan | None:
    """The groups this command asks for (None: none). ``at_run``: a launcher that starts them draws
    and holds their free ports; ``plan`` shows placeholders."""
    groups = asked(r, inputs)
    if groups is None:
        return None
    command = lighthouse_command(os.environ)
    elastic = plan.elastic is not None or inputs.want.elastic is not None
    check_before_meeting(r, inputs, elastic)
    problem = replica_groups_problem(groups, len(plan.ranks), plan.nnodes, elastic)
    if problem is None and (r.metrics_port is not None or r.stats_file):
        problem = "not with --metrics-port or --stats-file yet: every group's launcher would serve or write its own"
    if problem is not None:
        raise click.BadParameter(problem, param_hint="--replica-groups")
    pid = os.getpid() if at_run else None
    contexts = [run_context(f"{plan.run_id}-g{g}", tempfile.gettempdir(), pid, c.tr.log_dir) for g in range(groups)]
    given = inputs.want.master_port if inputs.want.master_port is not None else config.runtime.master_port
    if given is not None and given != FREE_PORT:  # torchft's torchx recipe: group G at PORT+G
        if given + groups - 1 > MAX_PORT:
            raise click.BadParameter(
                f"{groups} groups take MASTER_PORT {given}..{given + groups - 1}, beyond {MAX_PORT}: give a lower "
                "--master-port (or runtime.master_port)",
                param_hint="--replica-groups",
            )
        ports: list[int | None] = [given + g for g in range(groups)]
    elif at_run:  # group 0 keeps the node's free port; the others draw theirs, held as it is
        ports = [plan.master_port, *(free_port() for _ in range(groups - 1))]
    else:
        ports = [None] * groups
    assert command is not None  # check_before_meeting found it
    kind = lighthouse_kind(r, inputs)
    argv = (command,) if kind == "torchft" else (sys.executable, "-m", OPENCLAW_LIGHTHOUSE_MODULE)
    lighthouse_port = free_port() if at_run else None
    return plan_replica_groups(plan, groups, contexts, ports, (kind, argv), lighthouse_port, dict(os.environ))
