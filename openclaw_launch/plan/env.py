"""The per-rank environment: torchrun's variables, CUDA device selection by UUID, the job's
NCCL settings and our OPENCLAW_* identity.

Workers written for torchrun must run unchanged, so the torchrun set is reproduced
exactly. Values from the config are passed literally: there is no shell anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openclaw_launch.config.defaults import HANDLED_SIGNALS
from openclaw_launch.config.model import Runtime
from openclaw_launch.telemetry import wire
from openclaw_launch.topology.cpulist import format_cpulist

if TYPE_CHECKING:
    from openclaw_launch.plan.build import LaunchPlan

# Inherited variables of these families are copied into every rank's environment so the
# plan shows them and nodes can be compared (an NCCL_* set on one node only is a classic
# cause of a slow or hanging job).
_INHERITED_COMMON_PREFIXES = ("NCCL_", "TORCH_NCCL_")

# What torchrun sets for its workers: scripts written for it find all of these.
TORCHRUN_ENV: frozenset[str] = frozenset(
    "RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_RANK ROLE_NAME ROLE_WORLD_SIZE "
    "MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID "
    "TORCHELASTIC_USE_AGENT_STORE TORCHELASTIC_ERROR_FILE TORCHELASTIC_SIGNALS_TO_HANDLE".split()
)
# Our own per-rank identity (which GPU, where, on which CPUs).
_OPENCLAW_RANK_ENV = frozenset(
    "OPENCLAW_NODE OPENCLAW_NODE_RANK OPENCLAW_GPU_UUID OPENCLAW_PCI_BUS_ID OPENCLAW_NUMA_NODE OPENCLAW_CPUS "
    "OPENCLAW_BACKEND OPENCLAW_CUDA_DEVICE_INDEX".split()
) | {wire.SOCKET_ENV, wire.HOOKS_ENV}
# Set by the launcher for each rank; a user value for one of these is overridden.
RESERVED_ENV: frozenset[str] = (
    TORCHRUN_ENV | _OPENCLAW_RANK_ENV | {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "OPENCLAW_RUN_ID"}
)
# Legitimately different between ranks or nodes; everything else must match job-wide.
PER_RANK_ENV: frozenset[str] = _OPENCLAW_RANK_ENV | {
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_ERROR_FILE",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
}


@dataclass(frozen=True)
class JobEnv:
    """Facts shared by every rank of the job (and, apart from base_env, every node)."""

    run_id: str
    world_size: int
    nnodes: int
    master_addr: str
    master_port: int
    runtime: Runtime
    base_env: Mapping[str, str] = field(default_factory=dict)  # the launcher's inherited environment
    restart_count: int = 0
    max_restarts: int = 0
    error_file_dir: str | None = None
    telemetry_socket: str | None = None  # per-step statistics go here (telemetry.wire)
    telemetry_mode: str = "full"  # wire.TELEMETRY_MODES
    role: str = "default"  # ROLE_NAME (torchrun's --role)
    signals_to_handle: str = ",".join(HANDLED_SIGNALS)  # what the launcher forwards


@dataclass(frozen=True)
class RankSlot:
    """One rank's identity. ``gpu_uuid`` None = CPU worker."""

    rank: int
    local_rank: int
    local_world_size: int
    node: str
    node_rank: int
    cpus: tuple[int, ...]
    cores: int  # distinct physical cores in cpus (OMP_NUM_THREADS)
    gpu_uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cuda_visible_devices: str = ""  # see visible_devices()
    cuda_device_index: int | None = None  # the rank's GPU within CUDA_VISIBLE_DEVICES


def visible_devices(mode: str, node_uuids: Sequence[str], own_uuid: str) -> tuple[str, int]:
    """CUDA_VISIBLE_DEVICES and the rank's device index in it.

    ``ordered``: every node GPU once, in local-rank order, so with one process per GPU
    ``cuda:LOCAL_RANK`` is the planned GPU. ``isolated``: only the rank's own GPU (index 0).
    """
    if mode == "isolated":
        return own_uuid, 0
    return ",".join(node_uuids), list(node_uuids).index(own_uuid)


def common_user_env(runtime: Runtime, base_env: Mapping[str, str]) -> dict[str, str]:
    """NCCL and user variables, identical for every rank on every node that inherits alike."""
    env = {k: v for k, v in base_env.items() if k.startswith(_INHERITED_COMMON_PREFIXES)}
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if runtime.nccl_socket_nthreads is not None:
        env["NCCL_SOCKET_NTHREADS"] = str(runtime.nccl_socket_nthreads)
    if runtime.nccl_nthreads is not None:
        env["NCCL_NTHREADS"] = str(runtime.nccl_nthreads)
    env.update(runtime.nccl_env)
    env.update(runtime.env)
    return env


def overridden_user_vars(runtime: Runtime) -> tuple[str, ...]:
    """Config variables the launcher sets itself (and so ignores), for a plan warning."""
    return tuple(sorted(k for k in (*runtime.nccl_env, *runtime.env) if k in RESERVED_ENV))


def rank_env(job: JobEnv, slot: RankSlot) -> dict[str, str]:
    """The variables the launcher sets for one rank, on top of the inherited environment."""
    env = common_user_env(job.runtime, job.base_env)
    if "OMP_NUM_THREADS" not in job.base_env and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, slot.cores))
    env.update(_torchrun_env(job, slot))
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible_devices if slot.gpu_uuid is not None else ""
    env.update(_openclaw_env(job, slot))
    env.update(_telemetry_env(job, slot))
    return env


# NCCL's flight recorder with timing gives each rank's time in collectives, the wait signal on GPUs
# (the CPU does not wait in NCCL calls). Set only when the user has not chosen these themselves.
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "1000", "TORCH_NCCL_ENABLE_TIMING": "1"}  # 2 s of entries at ~300/s
_FLIGHT_RECORDER_USER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")


def _telemetry_env(job: JobEnv, slot: RankSlot) -> dict[str, str]:
    if job.telemetry_socket is None:
        return {}
    env = {wire.SOCKET_ENV: job.telemetry_socket}
    if job.telemetry_mode == "api":
        env[wire.HOOKS_ENV] = "0"
    user_set = any(
        k in job.base_env or k in job.runtime.env or k in job.runtime.nccl_env for k in _FLIGHT_RECORDER_USER_VARS
    )
    if job.telemetry_mode == "full" and slot.gpu_uuid is not None and not user_set:
        env.update(FLIGHT_RECORDER_ENV)
    return env


def common_env(plan: LaunchPlan) -> dict[str, str]:
    """The part of the environment that must be identical on every rank of every node
    (NCCL_*, user variables, world size, master address...), for comparing nodes."""
    if not plan.ranks:
        return {}
    return {k: v for k, v in sorted(plan.ranks[0].env.items()) if k not in PER_RANK_ENV}


def _torchrun_env(job: JobEnv, slot: RankSlot) -> dict[str, str]:
    env = {
        "RANK": str(slot.rank),
        "LOCAL_RANK": str(slot.local_rank),
        "WORLD_SIZE": str(job.world_size),
        "LOCAL_WORLD_SIZE": str(slot.local_world_size),
        "GROUP_RANK": str(slot.node_rank),
        "GROUP_WORLD_SIZE": str(job.nnodes),
        "ROLE_RANK": str(slot.rank),
        "ROLE_NAME": job.role,
        "ROLE_WORLD_SIZE": str(job.world_size),
        "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": str(job.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(job.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
        "TORCHELASTIC_RUN_ID": job.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": job.signals_to_handle,
    }
    if job.error_file_dir is not None:
        env["TORCHELASTIC_ERROR_FILE"] = f"{job.error_file_dir}/rank-{slot.rank}/error.json"
    return env


def _openclaw_env(job: JobEnv, slot: RankSlot) -> dict[str, str]:
    env = {
        "OPENCLAW_RUN_ID": job.run_id,
        "OPENCLAW_NODE": slot.node,
        "OPENCLAW_NODE_RANK": str(slot.node_rank),
        "OPENCLAW_GPU_UUID": slot.gpu_uuid or "",
        "OPENCLAW_PCI_BUS_ID": slot.pci_bus_id or "",
        "OPENCLAW_NUMA_NODE": "" if slot.numa_node is None else str(slot.numa_node),
        "OPENCLAW_CPUS": format_cpulist(slot.cpus),
        "OPENCLAW_BACKEND": "nccl" if slot.gpu_uuid is not None else "gloo",
    }
    if slot.cuda_device_index is not None:
        env["OPENCLAW_CUDA_DEVICE_INDEX"] = str(slot.cuda_device_index)
    return env
