"""YAML config -> typed, validated ``Config``.

The operators' format (``cluster.nodes[].gpus[]``, ``runtime.*``) is accepted
unchanged; our extensions sit beside those keys. Every problem names its key
path and YAML line, all problems are reported at once, and nothing is started
before the config is known to be good (exit code 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

BindingPolicy = Literal["node", "exclusive", "socket", "explicit", "none"]
MemPolicy = Literal["bind", "preferred", "local", "none"]
VisibleDevices = Literal["ordered", "isolated"]
Strictness = Literal["fail", "warn"]
MpsStartFailure = Literal["error", "warn"]

BINDING_POLICIES: tuple[str, ...] = ("node", "exclusive", "socket", "explicit", "none")
MEM_POLICIES: tuple[str, ...] = ("bind", "preferred", "local", "none")
VISIBLE_DEVICES_MODES: tuple[str, ...] = ("ordered", "isolated")


@dataclass(frozen=True)
class GpuSpec:
    """One configured GPU. ``pci_bus_id`` is normalised (``0000:0a:00.0``, lower case)."""

    uuid: str
    numa_node: int | None = None
    pci_bus_id: str | None = None
    nvlink_peers: tuple[str, ...] = ()
    cpus: tuple[int, ...] | None = None  # explicit CPU list (binding "explicit")
    line: int | None = None


@dataclass(frozen=True)
class NodeSpec:
    """One host. Exactly one of ``gpus`` (non-empty) or ``cpu_workers`` is set."""

    name: str
    ip: str | None = None
    gpus: tuple[GpuSpec, ...] = ()
    cpu_workers: int | None = None
    line: int | None = None

    @property
    def is_cpu(self) -> bool:
        return self.cpu_workers is not None


@dataclass(frozen=True)
class Runtime:
    """Job-wide settings, identical for every rank on every node."""

    enable_mps: bool = False
    mps_max_clients_per_gpu: int | None = None
    mps_active_thread_percentage: int | None = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    mps_pinned_device_mem_limit: str | None = None  # e.g. "40G" -> per-device pinned limit
    mps_on_start_failure: MpsStartFailure = "error"
    nccl_socket_nthreads: int | None = None  # -> NCCL_SOCKET_NTHREADS
    nccl_nthreads: int | None = None  # -> NCCL_NTHREADS
    nccl_env: Mapping[str, str] = field(default_factory=dict)  # NCCL_* for all ranks
    env: Mapping[str, str] = field(default_factory=dict)  # any other variables for all ranks
    binding: BindingPolicy = "node"
    mem_policy: MemPolicy = "bind"
    visible_devices: VisibleDevices = "ordered"
    procs_per_gpu: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    strictness: Strictness = "fail"  # bus-id / NUMA / NVLink-peer mismatches


@dataclass(frozen=True)
class Config:
    nodes: tuple[NodeSpec, ...]
    runtime: Runtime = field(default_factory=Runtime)
    source: str = "<config>"
    warnings: tuple[str, ...] = ()  # e.g. deprecated NCCL variables, shared IPs

    def node(self, name: str) -> NodeSpec:
        """The node called ``name``; the error lists the valid names."""
        for n in self.nodes:
            if n.name == name:
                return n
        from openclaw_launch.errors import PlanError

        names = ", ".join(n.name for n in self.nodes)
        raise PlanError(f"node {name!r} is not in {self.source}; the config has: {names}")
