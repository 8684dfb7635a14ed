"""The per-rank environment, final: torchrun's variables, CUDA device selection by UUID, the job's
NCCL settings, our OPENCLAW_* identity, and the run's channels (error file, telemetry socket, hang
detection, MPS client, parallel groups file), so the plan shows every variable ``run`` sets.

Workers written for torchrun must run unchanged, so the torchrun set is reproduced
exactly. Values from the config are passed literally: there is no shell anywhere.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openclaw_launch.config.model import Runtime
from openclaw_launch.plan.context import FREE_PORT_PLACEHOLDER, RunDir
from openclaw_launch.plan.parallel import PARALLEL_FILE_ENV, ParallelLayout
from openclaw_launch.telemetry import wire
from openclaw_launch.topology.cpulist import format_cpulist

if TYPE_CHECKING:
    from openclaw_launch.plan.model import LaunchPlan

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
) | {wire.SOCKET_ENV, wire.HOOKS_ENV, wire.SLOT_ENV, wire.TOKEN_ENV}
#: What ``runtime.nic_binding: nearest`` sets per rank: the RDMA device (``NCCL_IB_HCA``), or
#: the Ethernet interface (``NCCL_SOCKET_IFNAME``), by kind of NIC; ``=`` asks NCCL for an exact
#: match (``mlx5_1`` alone would also select mlx5_10 and mlx5_11).
NIC_ENV: Mapping[str, str] = {"ib": "NCCL_IB_HCA", "eth": "NCCL_SOCKET_IFNAME"}
# Set by the launcher for each rank; a user value for one of these is overridden.
RESERVED_ENV: frozenset[str] = (
    TORCHRUN_ENV | _OPENCLAW_RANK_ENV | {"CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "OPENCLAW_RUN_ID"}
)
# The MPS client's variables: the private daemon's directories (run/mps/daemon.py starts it there).
MPS_CLIENT_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")

# Legitimately different between ranks or nodes (paths in each launcher's run directory, named by
# its pid, differ per node); everything else must match job-wide.
PER_RANK_ENV: frozenset[str] = _OPENCLAW_RANK_ENV | {
    *MPS_CLIENT_ENV,
    wire.STACKS_ENV,
    PARALLEL_FILE_ENV,
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
    """Facts shared by every rank of this node's launcher (and, apart from base_env and the run
    directory's paths, every node)."""

    run_id: str
    world_size: int
    nnodes: int
    master_addr: str
    master_port: int | None  # None: found free at run start (FREE_PORT_PLACEHOLDER in the plan)
    runtime: Runtime
    run_dir: RunDir
    role: str
    signals_to_handle: str  # TORCHELASTIC_SIGNALS_TO_HANDLE: what the launcher forwards
    base_env: Mapping[str, str] = field(default_factory=dict)  # the launcher's inherited environment
    max_restarts: int = 0
    telemetry_socket: str | None = None  # per-step statistics go here (telemetry.wire); None = off
    telemetry_mode: str = "hooks"  # wire.TELEMETRY_MODES
    hang_detection: bool = False  # progress datagrams and a stack file per rank (stats/hang.py)
    flush_interval_s: float = wire.FLUSH_INTERVAL_S  # wire.flush_interval_s(--stats-interval-s)
    mps: bool = False  # the ranks are clients of this launcher's private MPS daemon
    parallel: ParallelLayout | None = None  # TP/PP/DP groups: coordinates and the groups file


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
    nic: tuple[str, str] | None = None  # (kind, name) of its NIC under runtime.nic_binding: nearest


def worker_python(environ: Mapping[str, str]) -> str:
    """The interpreter of script and module targets: torchrun's ``PYTHON_EXEC``, else the launcher's.
    The plan's argv, the fingerprint's Python version and ``validate`` all ask this one rule."""
    return environ.get("PYTHON_EXEC") or sys.executable


def visible_devices(mode: str, node_uuids: Sequence[str], own_uuid: str) -> tuple[str, int]:
    """CUDA_VISIBLE_DEVICES and the rank's device index in it.

    ``ordered``: every node GPU once, in local-rank order, so with one process per GPU
    ``cuda:LOCAL_RANK`` is the planned GPU. ``isolated``: only the rank's own GPU (index 0).
    """
    if mode == "isolated":
        return own_uuid, 0
    return ",".join(node_uuids), list(node_uuids).index(own_uuid)


def mps_client_env(pipe_dir: str | os.PathLike[str], log_dir: str | os.PathLike[str]) -> dict[str, str]:
    """What makes a process a client of the MPS daemon that serves ``pipe_dir`` (the ranks of an MPS
    plan; a benchmark's own clients)."""
    pipe, log = MPS_CLIENT_ENV
    return {pipe: os.fspath(pipe_dir), log: os.fspath(log_dir)}


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
    if slot.gpu_uuid is not None:
        env["CUDA_VISIBLE_DEVICES"] = slot.cuda_visible_devices
    else:  # a CPU worker keeps the launcher's (a user's value left alone, as by torchrun)
        env.pop("CUDA_VISIBLE_DEVICES", None)
    if slot.nic is not None:
        kind, name = slot.nic
        env[NIC_ENV[kind]] = f"={name}"
    env.update(_openclaw_env(job, slot))
    env.update(_telemetry_env(job, slot))
    if job.mps:
        env.update(mps_client_env(job.run_dir.mps_pipe_dir, job.run_dir.mps_log_dir))
    if job.parallel is not None:
        env.update(job.parallel.rank_env(slot.rank))
        env[PARALLEL_FILE_ENV] = str(job.run_dir.parallel_file)
    return env


# NCCL's flight recorder with timing gives each rank's time in collectives, the wait signal on GPUs
# (the CPU does not wait in NCCL calls). Set only when the user has not chosen these themselves.
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "1000", "TORCH_NCCL_ENABLE_TIMING": "1"}  # 2 s of entries at ~300/s
_FLIGHT_RECORDER_USER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")


def _telemetry_env(job: JobEnv, slot: RankSlot) -> dict[str, str]:
    if job.telemetry_socket is None:
        return {}
    env = {
        wire.SOCKET_ENV: job.telemetry_socket,
        wire.SLOT_ENV: str(slot.local_rank),
        wire.TOKEN_ENV: job.run_dir.token,
        wire.FLUSH_ENV: str(job.flush_interval_s),  # the live verdict sees steps at most this late
    }
    if job.telemetry_mode == "api":
        env[wire.HOOKS_ENV] = "0"
    user_set = any(
        k in job.base_env or k in job.runtime.env or k in job.runtime.nccl_env for k in _FLIGHT_RECORDER_USER_VARS
    )
    if job.telemetry_mode == "full" and slot.gpu_uuid is not None and not user_set:
        env.update(FLIGHT_RECORDER_ENV)
    if job.hang_detection:  # telemetry/recorder.py sends progress, telemetry/bootstrap.py arms the stack dump
        env[wire.PROGRESS_ENV] = str(wire.PROGRESS_INTERVAL_S)
        env[wire.STACKS_ENV] = str(job.run_dir.stacks_file(slot.rank))
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
        "MASTER_PORT": FREE_PORT_PLACEHOLDER if job.master_port is None else str(job.master_port),
        # Attempt 0's value: the supervisor sets this one variable to the attempt's number at each
        # restart (docs/plan-format.md), as torchrun does.
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
        "TORCHELASTIC_RUN_ID": job.run_id,
        "TORCHELASTIC_USE_AGENT_STORE": str(uses_agent_store(job.base_env)),
        "TORCHELASTIC_SIGNALS_TO_HANDLE": job.signals_to_handle,
        "TORCHELASTIC_ERROR_FILE": str(job.run_dir.error_file(slot.rank)),
    }
    return env


#: torchrun's opt-out of the shared store (its c10d rendezvous reads it): with ``1`` the workers'
#: store is rank 0's own again (TORCHELASTIC_USE_AGENT_STORE=False) and no launcher hosts one.
DISABLE_AGENT_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def uses_agent_store(base_env: Mapping[str, str]) -> bool:
    """The ranks open node rank 0's launcher's store (agents/worker_store.py) as torchrun's open its
    agent's: always, unless the launching environment opts out as torchrun allows."""
    return base_env.get(DISABLE_AGENT_STORE_ENV, "0") != "1"


def agent_store_endpoint(env: Mapping[str, str]) -> int | None:
    """The port this node's launcher hosts the workers' store on, read from a rank's final
    environment (the plan's, or a re-formed world's): MASTER_PORT where the rank is told of the
    agent store and its node is node rank 0 (GROUP_RANK 0); None: another node hosts it, or none."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("GROUP_RANK") != "0":
        return None
    port = env.get("MASTER_PORT", "")
    return int(port) if port.isdigit() else None


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
