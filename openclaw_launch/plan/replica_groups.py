"""torchft's replica groups as one command (``--replica-groups K``, ``runtime.replica_groups``): the
node's plan cut into K worlds, and the lighthouse that joins them. Pure, as plan/build.py: ``plan``
shows exactly what ``run`` starts (job/replica_groups.py).

torchft's recipe is a lighthouse, then one torchrun per replica group, each with its own
``--master_port`` and ``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS`` and ``TORCHFT_LIGHTHOUSE`` set by
hand (torchft/torchx.py, its README's two shells). Here group G holds the node's local ranks
G*M .. G*M+M-1 (M = ranks / K) and is a world of its own: RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE and ROLE_* numbered within it, its own MASTER_PORT (the workers' store its
launcher hosts), error files, statistics socket and logs (run id ``RUNID-gG``), and on GPUs only its
own GPUs visible (as the README's ``CUDA_VISIBLE_DEVICES=G``). Every rank is told the lighthouse
(``TORCHFT_LIGHTHOUSE``), its group and the number of groups, which torchft's Manager and its
examples read; the Manager of each group's rank 0 asks the lighthouse for a quorum every step.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from openclaw_launch.codec import to_json
from openclaw_launch.config.defaults import (
    LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS,
    LIGHTHOUSE_JOIN_TIMEOUT_MS,
    LIGHTHOUSE_MIN_REPLICAS,
    LIGHTHOUSE_QUORUM_TICK_MS,
    LIGHTHOUSE_START_TIMEOUT_MS,
)
from openclaw_launch.errors import PlanError
from openclaw_launch.plan.context import FREE_PORT_PLACEHOLDER, RunContext
from openclaw_launch.plan.format import format_plan_table
from openclaw_launch.plan.model import LaunchPlan, RankPlan
from openclaw_launch.telemetry import wire

#: torchft's lighthouse's console script (``torchft_lighthouse = torchft._torchft:lighthouse_main``).
LIGHTHOUSE_COMMAND = "torchft_lighthouse"
#: openclaw's lighthouse (``--lighthouse openclaw``), run as ``python -m`` with torchft_lighthouse's options.
OPENCLAW_LIGHTHOUSE_MODULE = "openclaw_launch.run.lighthouse_server"
#: Its notices' FIFO (``gone PORT`` lines, job/replica_groups.py), in its environment.
LIGHTHOUSE_NOTICES_ENV = "OPENCLAW_LIGHTHOUSE_NOTICES"
#: What every rank of group G is told, beside its own world's torchrun variables.
GROUP_ENV = ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS", "TORCHFT_LIGHTHOUSE")
#: The Manager's port on each group's rank 0 (torchft/manager.py; default 0: a free one).
MANAGER_PORT_ENV = "TORCHFT_MANAGER_PORT"
INSTALL_HINT = "pip install 'openclaw-launch[torchft]' (or: pip install torchft)"


@dataclass(frozen=True)
class LighthousePlan:
    """The lighthouse (``kind``: one of config/defaults.py's ``LIGHTHOUSES``), which this launcher
    starts before the groups and stops after them."""

    kind: str
    argv: tuple[str, ...]
    port: int | None  # None: a free port ``run`` finds (FREE_PORT_PLACEHOLDER)
    address: str  # TORCHFT_LIGHTHOUSE of every rank


@dataclass(frozen=True)
class ReplicaGroupsPlan:
    """The node's K groups, each a ``LaunchPlan`` of its own world, and their lighthouse."""

    node_plan: LaunchPlan  # the node's plan the groups are cut from (its warnings, its run id)
    lighthouse: LighthousePlan
    groups: tuple[LaunchPlan, ...]

    def to_json(self) -> dict[str, object]:
        """The node's plan JSON with the groups' ranks (each with ``replica_group``), and the groups."""
        doc = self.node_plan.to_json()
        doc["ranks"] = [
            {**to_json(rank), "replica_group": index} for index, group in enumerate(self.groups) for rank in group.ranks
        ]
        doc["replica_groups"] = {
            "count": len(self.groups),
            "lighthouse": to_json(self.lighthouse),
            "groups": [
                {
                    "group": index,
                    "run_id": group.run_id,
                    "world_size": group.world_size,
                    "master_port": group.master_port,
                }
                for index, group in enumerate(self.groups)
            ],
        }
        return doc


def replica_groups_problem(groups: int, local_ranks: int, nnodes: int, elastic: bool) -> str | None:
    """Why K replica groups cannot be laid out here (None: they can): the one rule ``plan`` and ``run``
    apply, before anything starts."""
    if groups < 1:
        return f"{groups}: give at least 1 replica group"
    if elastic:
        return "not with an elastic job (--nnodes MIN:MAX): torchft's replica groups are its elasticity; use --nnodes 1"
    if nnodes > 1:
        return (
            f"one node only ({nnodes} nodes given): the groups are cut from this node's ranks; for several nodes "
            "start one launcher per replica group, as torchft's README does with torchrun"
        )
    if local_ranks % groups:
        divisors = ", ".join(str(d) for d in range(1, local_ranks + 1) if local_ranks % d == 0)
        return f"{groups} does not divide the node's {local_ranks} ranks; give one of {divisors}"
    return None


def lighthouse_argv(
    command: Sequence[str], port: int | None, host: str, expected_replicas: int | None = None
) -> tuple[str, ...]:
    """torchft's README line (``--min_replicas 1``), with heartbeat and join timeouts short enough
    that the other groups' quorum waits little for a group that is gone or restarting, and a finer
    quorum tick (config/defaults.py says why each); openclaw's lighthouse takes the same options, and
    with ``expected_replicas`` (the K groups; openclaw's only) its first quorum waits for them all, up
    to the start timeout (run/lighthouse_quorum.py)."""
    shown = FREE_PORT_PLACEHOLDER if port is None else str(port)
    bind = f"[::]:{shown}" if ":" in host else f"0.0.0.0:{shown}"
    start = () if expected_replicas is None else _start_options(expected_replicas)
    return (
        *command,
        "--min_replicas",
        str(LIGHTHOUSE_MIN_REPLICAS),
        "--quorum_tick_ms",
        str(LIGHTHOUSE_QUORUM_TICK_MS),
        "--join_timeout_ms",
        str(LIGHTHOUSE_JOIN_TIMEOUT_MS),
        "--heartbeat_timeout_ms",
        str(LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS),
        "--bind",
        bind,
        *start,
    )


def _start_options(expected_replicas: int) -> tuple[str, ...]:
    return ("--expected_replicas", str(expected_replicas), "--start_timeout_ms", str(LIGHTHOUSE_START_TIMEOUT_MS))


def plan_replica_groups(
    plan: LaunchPlan,
    groups: int,
    contexts: Sequence[RunContext],
    master_ports: Sequence[int | None],
    lighthouse: tuple[str, tuple[str, ...]],
    lighthouse_port: int | None,
    base_env: Mapping[str, str] | None = None,
) -> ReplicaGroupsPlan:
    """Cut the node's plan into ``groups`` worlds. ``contexts``: each group's run facts (run id
    ``RUNID-gG``, its run directory); ``master_ports``: each group's MASTER_PORT (None: found free
    at run); ``lighthouse``: its kind and command (torchft's executable, or openclaw's ``python -m``
    line); ``base_env``: the launcher's
    environment (a ``TORCHFT_MANAGER_PORT`` there is every group's otherwise)."""
    problem = replica_groups_problem(groups, len(plan.ranks), plan.nnodes, plan.elastic is not None)
    if problem is None and plan.parallel is not None:
        problem = "not with a TP/PP/DP layout (--tp/--pp/--dp, parallel:): each replica group is one data-parallel copy"
    if problem is None and plan.mps is not None:
        problem = "not with runtime.enable_mps: each group's launcher would start its own MPS daemon"
    if problem is not None:
        raise PlanError(f"--replica-groups {problem}")
    shown_port = FREE_PORT_PLACEHOLDER if lighthouse_port is None else str(lighthouse_port)
    address = f"http://{plan.master_addr}:{shown_port}"
    size = len(plan.ranks) // groups
    manager_port = _manager_port(plan, base_env or {})
    cut = tuple(
        _group_plan(plan, g, groups, plan.ranks[g * size : (g + 1) * size], contexts[g], master_ports[g], address)
        for g in range(groups)
    )
    if manager_port:  # torchft's README line sets one (29512): each group's rank 0 binds it, so group G gets P+G
        cut = tuple(_with_env(p, {MANAGER_PORT_ENV: str(manager_port + g)}) for g, p in enumerate(cut))
    kind, command = lighthouse
    argv = lighthouse_argv(command, lighthouse_port, plan.master_addr, groups if kind == "openclaw" else None)
    return ReplicaGroupsPlan(plan, LighthousePlan(kind, argv, lighthouse_port, address), cut)


def _group_plan(
    plan: LaunchPlan,
    group: int,
    groups: int,
    ranks: Sequence[RankPlan],
    context: RunContext,
    master_port: int | None,
    lighthouse: str,
) -> LaunchPlan:
    uuids = list(dict.fromkeys(r.gpu_uuid for r in ranks if r.gpu_uuid is not None))
    socket = context.run_dir.socket if plan.telemetry_socket is not None else None
    renumbered = []
    for index, rank in enumerate(ranks):
        env = dict(rank.env)
        world = {"RANK": index, "WORLD_SIZE": len(ranks), "LOCAL_WORLD_SIZE": len(ranks), "ROLE_RANK": index}
        env.update({k: str(v) for k, v in world.items()})
        env["ROLE_WORLD_SIZE"] = str(len(ranks))
        if rank.env.get("LOCAL_RANK") == str(rank.local_rank):  # (--virtual-local-rank keeps its 0)
            env["LOCAL_RANK"] = str(index)
        env["MASTER_PORT"] = FREE_PORT_PLACEHOLDER if master_port is None else str(master_port)
        env["TORCHELASTIC_ERROR_FILE"] = str(context.run_dir.error_file(index))
        if socket is not None:
            env.update({wire.SOCKET_ENV: socket, wire.SLOT_ENV: str(index), wire.TOKEN_ENV: context.run_dir.token})
        if wire.STACKS_ENV in env:
            env[wire.STACKS_ENV] = str(context.run_dir.stacks_file(index))
        if rank.gpu_uuid is not None and "," in env.get("CUDA_VISIBLE_DEVICES", ""):  # ordered: the group's GPUs
            env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
            env["OPENCLAW_CUDA_DEVICE_INDEX"] = str(uuids.index(rank.gpu_uuid))
        env.update(zip(GROUP_ENV, (str(group), str(groups), lighthouse), strict=True))
        renumbered.append(replace(rank, rank=index, local_rank=index, env=env))
    return replace(
        plan,
        run_id=context.run_id,
        world_size=len(ranks),
        master_port=master_port,
        ranks=tuple(renumbered),
        warnings=(),
        telemetry_socket=socket,
        run_dir=context.run_dir,
    )


def _manager_port(plan: LaunchPlan, base_env: Mapping[str, str]) -> int | None:
    """A TORCHFT_MANAGER_PORT given (the config's ``runtime.env``, else the launching environment)."""
    given = plan.ranks[0].env.get(MANAGER_PORT_ENV, base_env.get(MANAGER_PORT_ENV, "")) if plan.ranks else ""
    return int(given) if given.isdigit() and int(given) > 0 else None


def _with_env(plan: LaunchPlan, extra: Mapping[str, str]) -> LaunchPlan:
    return replace(plan, ranks=tuple(replace(r, env={**r.env, **extra}) for r in plan.ranks))


def format_replica_groups(groups: ReplicaGroupsPlan) -> str:
    """The text ``plan`` prints: the lighthouse, then each group's table."""
    lines = [
        f"replica groups {len(groups.groups)} (torchft): {groups.lighthouse.kind}'s lighthouse "
        f"{groups.lighthouse.address}: " + shlex.join(groups.lighthouse.argv)
    ]
    for g, plan in enumerate(groups.groups):
        lines += [f"replica group {g}:", format_plan_table(plan, warnings=False)]
    return "\n".join(lines)
