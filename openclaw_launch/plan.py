"""Config + Topology + options -> LaunchPlan. Pure: no I/O, no clock, no os.environ.

Everything the launcher will do to start a rank is decided here and can be
printed (``openclaw-launch plan``) before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

EntryKind = Literal["script", "module", "exec"]

PLAN_SCHEMA = 1


@dataclass(frozen=True)
class Entry:
    """What each worker runs: ``python script args``, ``python -m module args`` or ``cmd args``."""

    kind: EntryKind
    target: str
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanOptions:
    entry: Entry
    node: str | None = None  # which config node this launcher is; None = the only / first match
    python: str = "python3"  # interpreter for script/module entries (the launcher passes sys.executable)
    base_env: Mapping[str, str] = field(default_factory=dict)  # the launcher's environment (read-only)
    run_id: str = "none"
    master_addr: str | None = None  # CLI overrides config
    master_port: int | None = None  # CLI overrides config
    max_restarts: int = 0
    restart_count: int = 0
    error_file_dir: str | None = None  # TORCHELASTIC_ERROR_FILE lives under it, per rank
    numactl: str | None = "numactl"  # path to numactl; None = not installed (plan without it, warn)
    strictness: str | None = None  # CLI override of runtime.strictness


@dataclass(frozen=True)
class RankPlan:
    rank: int
    local_rank: int
    node: str
    node_rank: int  # GROUP_RANK
    gpu_uuid: str | None  # None for CPU workers
    gpu_index: int | None
    pci_bus_id: str | None
    numa_node: int | None
    cpus: tuple[int, ...]
    mem_policy: str
    mem_nodes: tuple[int, ...]
    argv: tuple[str, ...]
    env: Mapping[str, str]  # variables the launcher sets on top of the inherited environment

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "node": self.node,
            "node_rank": self.node_rank,
            "gpu_uuid": self.gpu_uuid,
            "gpu_index": self.gpu_index,
            "pci_bus_id": self.pci_bus_id,
            "numa_node": self.numa_node,
            "cpus": list(self.cpus),
            "mem_policy": self.mem_policy,
            "mem_nodes": list(self.mem_nodes),
            "argv": list(self.argv),
            "env": dict(self.env),
        }


@dataclass(frozen=True)
class MpsPlan:
    """The MPS daemon this node's launcher owns (runtime.enable_mps)."""

    max_clients_per_gpu: int | None
    active_thread_percentage: int | None
    pinned_device_mem_limit: str | None
    on_start_failure: str  # "error" | "warn"
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    node: str
    node_rank: int
    nnodes: int
    world_size: int
    master_addr: str
    master_port: int
    backend: str  # "nccl" or "gloo"
    ranks: tuple[RankPlan, ...]
    mps: MpsPlan | None = None
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "schema": PLAN_SCHEMA,
            "run_id": self.run_id,
            "node": self.node,
            "node_rank": self.node_rank,
            "nnodes": self.nnodes,
            "world_size": self.world_size,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "backend": self.backend,
            "mps": None
            if self.mps is None
            else {
                "max_clients_per_gpu": self.mps.max_clients_per_gpu,
                "active_thread_percentage": self.mps.active_thread_percentage,
                "pinned_device_mem_limit": self.mps.pinned_device_mem_limit,
                "on_start_failure": self.mps.on_start_failure,
                "gpu_uuids": list(self.mps.gpu_uuids),
            },
            "warnings": list(self.warnings),
            "ranks": [r.to_json() for r in self.ranks],
        }
