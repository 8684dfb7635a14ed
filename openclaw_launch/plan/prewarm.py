"""``--prewarm MODULE[,MODULE...]`` (``runtime.prewarm``): the plan of the zygote (run/zygote.py)
that imports the modules once and forks every worker of every attempt from there
(docs/plan-format.md, "prewarm"; the names' rule is config/prewarm.py's).

The rule lives here, once: where a zygote can stand for the plan's
command (a Python entry: ``python -u ...`` after an optional numactl prefix whose flags the worker
applies itself), and the zygote's own command line. Each rank's ``argv`` stays what it would be
without ``--prewarm``: the zygote's worker does exactly that (run/prewarm.py reads it back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from openclaw_launch.errors import PlanError
from openclaw_launch.topology.cpulist import parse_cpulist

ZYGOTE_MODULE = "openclaw_launch.run.zygote"
ZYGOTE_LINK_ENV = "OPENCLAW_ZYGOTE_LINK_FD"  # the zygote's end of the launcher's link (an fd it inherits)
_MEM_FLAGS = {"--membind": "bind", "--preferred": "preferred"}


@dataclass(frozen=True)
class PrewarmPlan:
    """The zygote: its command (``argv``), the modules it imports, and the ``python -u ...`` that
    ends every rank's argv (``entry``), which each worker it forks runs."""

    modules: tuple[str, ...]
    argv: tuple[str, ...]
    entry: tuple[str, ...]


def prewarm_plan(modules: Sequence[str], entry_kind: str, entry_argv: Sequence[str]) -> PrewarmPlan:
    """The zygote for ranks that run ``entry_argv``; refused (exit 2) where it cannot stand for it."""
    if entry_kind == "exec" or tuple(entry_argv[1:2]) != ("-u",):
        raise PlanError(
            "--prewarm (runtime.prewarm) needs a Python entry (a script or -m MODULE): with --no-python the "
            "command is no Python the zygote could have imported for; drop --prewarm or run a Python entry"
        )
    python = entry_argv[0]
    return PrewarmPlan(tuple(modules), (python, "-u", "-m", ZYGOTE_MODULE, *modules), tuple(entry_argv))


@dataclass(frozen=True)
class NumactlFlags:
    """What a plan's numactl prefix (plan/binding.numactl_argv) asks for."""

    cpus: tuple[int, ...] = ()
    cpu_nodes: tuple[int, ...] = ()
    mem_policy: str = "none"
    mem_nodes: tuple[int, ...] = ()


def read_numactl(prefix: Sequence[str]) -> NumactlFlags | None:
    """The flags of ``[numactl, --flag=..., ...]`` as numactl_argv writes them; None for anything else."""
    cpus: tuple[int, ...] = ()
    cpu_nodes: tuple[int, ...] = ()
    mem_policy = "none"
    mem_nodes: tuple[int, ...] = ()
    try:
        for flag in prefix[1:]:
            name, _, value = flag.partition("=")
            if name == "--physcpubind":
                cpus = parse_cpulist(value)
            elif name == "--cpunodebind":
                cpu_nodes = parse_cpulist(value)
            elif name in _MEM_FLAGS:
                mem_policy, mem_nodes = _MEM_FLAGS[name], parse_cpulist(value)
            elif flag == "--localalloc":
                mem_policy = "local"
            else:
                return None
    except ValueError:
        return None
    return NumactlFlags(cpus, cpu_nodes, mem_policy, mem_nodes)
