"""The MPS part of the plan as rules and command text (pure: no process, no psutil).

The client limit per GPU, the settings' checks (``config``'s rules) and the
``set_default_*`` / ``get_default_*`` commands that apply the limits.
"""

from __future__ import annotations

from openclaw_launch.config.model import active_thread_percentage_problem, pinned_limit_problem, procs_per_gpu_problem
from openclaw_launch.errors import PlanError
from openclaw_launch.plan.model import LaunchPlan, MpsPlan


def validate_pinned_limit(value: str) -> str:
    """``set_default_device_pinned_mem_limit`` takes an integer followed by M or G (``config``'s rule)."""
    problem = pinned_limit_problem(value)
    if problem is not None:
        raise PlanError(f"runtime.mps_pinned_device_mem_limit {problem}")
    return value


def check_settings(mps: MpsPlan) -> None:
    """Raise PlanError for an active thread percentage or pinned memory limit the daemon would reject."""
    pct = mps.active_thread_percentage
    problem = active_thread_percentage_problem(pct) if pct is not None else None
    if problem is not None:
        raise PlanError(f"runtime.mps_active_thread_percentage: {problem}")
    if mps.pinned_device_mem_limit is not None:
        validate_pinned_limit(mps.pinned_device_mem_limit)


def limit_commands(mps: MpsPlan) -> list[tuple[str, str]]:
    """(set, get) control commands for the configured defaults, in the order they are applied."""
    commands: list[tuple[str, str]] = []
    if mps.active_thread_percentage is not None:
        commands.append(
            (
                f"set_default_active_thread_percentage {mps.active_thread_percentage}",
                "get_default_active_thread_percentage",
            )
        )
    if mps.pinned_device_mem_limit is not None:
        # Device ordinals as the daemon sees them: CUDA_VISIBLE_DEVICES renumbers the planned GPUs 0..n-1.
        for dev in range(len(mps.gpu_uuids)):
            commands.append(
                (
                    f"set_default_device_pinned_mem_limit {dev} {mps.pinned_device_mem_limit}",
                    f"get_default_device_pinned_mem_limit {dev}",
                )
            )
    return commands


def clients_per_gpu(plan: LaunchPlan) -> dict[str, int]:
    """How many ranks (each one MPS client) this node's plan puts on each GPU."""
    counts: dict[str, int] = dict.fromkeys(plan.mps.gpu_uuids if plan.mps else (), 0)
    for rank in plan.ranks:
        if rank.gpu_uuid is not None:
            counts[rank.gpu_uuid] = counts.get(rank.gpu_uuid, 0) + 1
    return counts


def check_client_limit(plan: LaunchPlan) -> dict[str, int]:
    """Raise PlanError when a GPU would get more clients than runtime.mps_max_clients_per_gpu."""
    counts = clients_per_gpu(plan)
    limit = plan.mps.max_clients_per_gpu if plan.mps else None
    if limit is None:
        return counts
    over = {uuid: n for uuid, n in counts.items() if n > limit}
    problem = procs_per_gpu_problem(max(over.values()), True, limit) if over else None
    if problem is not None:
        listed = ", ".join(f"{uuid}: {n}" for uuid, n in over.items())
        raise PlanError(
            f"runtime.mps_max_clients_per_gpu is {limit} but the plan puts more ranks on these GPUs "
            f"({listed}): {problem}"
        )
    return counts
