"""A configured GPU held to the GPU found on the host: its PCI bus id, NUMA node and NVLink peers.

The one definition of these rules: ``plan`` turns a mismatch into a failed launch or a warning (per
``runtime.strictness``), ``validate`` into one result line per check. Pure over a ``Topology``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from openclaw_launch.config.model import GpuSpec
from openclaw_launch.topology.model import INACTIVE_NVLINK, GpuInfo, Topology, normalize_bus_id

#: match: the host agrees; mismatch: it does not (strictness decides); unknown: the host cannot say.
Outcome = Literal["match", "mismatch", "unknown"]


@dataclass(frozen=True)
class GpuCheck:
    """One rule applied to one configured GPU."""

    name: str  # "bus_id" | "numa_node" | "nvlink_peer": validate's check names
    outcome: Outcome
    found: str  # what the host has
    expected: str  # what the config says
    problem: str = ""  # mismatch / unknown: what is wrong, naming the GPU
    advice: str = ""  # what to do about it


def identity_checks(spec: GpuSpec, gpu: GpuInfo, topology: Topology) -> list[GpuCheck]:
    """Bus id and NUMA node (when configured), then each configured NVLink peer."""
    checks = [bus_id_check(spec, gpu), numa_node_check(spec, gpu)]
    checks += [nvlink_peer_check(spec, gpu, peer, topology) for peer in spec.nvlink_peers]
    return [c for c in checks if c is not None]


def bus_id_check(spec: GpuSpec, gpu: GpuInfo) -> GpuCheck | None:
    if spec.pci_bus_id is None:
        return None
    expected = _bus(spec.pci_bus_id)
    if gpu.pci_bus_id is None:
        return GpuCheck("bus_id", "unknown", "not available", expected, "the host did not report a bus id")
    found = _bus(gpu.pci_bus_id)
    if found == expected:
        return GpuCheck("bus_id", "match", found, expected)
    return GpuCheck(
        "bus_id",
        "mismatch",
        found,
        expected,
        f"pci_bus_id is {spec.pci_bus_id} in the config but {spec.uuid} is at {gpu.pci_bus_id}",
        "the GPU moved slot or the config is stale; update pci_bus_id",
    )


def numa_node_check(spec: GpuSpec, gpu: GpuInfo) -> GpuCheck | None:
    if spec.numa_node is None:
        return None
    expected = str(spec.numa_node)
    if gpu.numa_node is None:
        problem = f"the host reports no NUMA information for {spec.uuid} (sysfs numa_node -1)"
        return GpuCheck("numa_node", "unknown", "not available", expected, problem)
    if gpu.numa_node == spec.numa_node:
        return GpuCheck("numa_node", "match", str(gpu.numa_node), expected)
    return GpuCheck(
        "numa_node",
        "mismatch",
        str(gpu.numa_node),
        expected,
        f"numa_node is {spec.numa_node} in the config but {spec.uuid} is on NUMA node {gpu.numa_node}",
        "workers would be bound to the wrong socket and cross the CPU interconnect; update numa_node",
    )


def planned_numa_node(spec: GpuSpec, gpu: GpuInfo) -> int | None:
    """The NUMA node a rank on ``gpu`` is bound to: the host's (sysfs wins), the config's when the
    host has none."""
    return gpu.numa_node if gpu.numa_node is not None else spec.numa_node


def nvlink_peer_check(spec: GpuSpec, gpu: GpuInfo, peer_uuid: str, topology: Topology) -> GpuCheck:
    """The link to a configured peer, as ``Topology.link_between`` judges it. A link the host
    knows nothing about is unknown, not a mismatch."""
    expected = f"NVLink to {peer_uuid}"
    peer = topology.gpu_by_uuid(peer_uuid)
    if peer is None:
        problem = f"NVLink peer {peer_uuid} is not on this host"
        return GpuCheck("nvlink_peer", "mismatch", "peer not on this host", expected, problem, "check nvlink_peers")
    kind = topology.link_between(gpu, peer)
    found = f"{kind or 'unknown'} to GPU {peer.index}"
    if kind is None:
        return GpuCheck("nvlink_peer", "unknown", found, expected, "link type not available")
    if topology.nvlinked(gpu, peer):
        return GpuCheck("nvlink_peer", "match", found, expected)
    down = kind == INACTIVE_NVLINK
    return GpuCheck(
        "nvlink_peer",
        "mismatch",
        found,
        expected,
        f"{spec.uuid} is not NVLinked to its configured peer {peer_uuid} (link found: {kind})",
        "traffic to this peer goes over PCIe; "
        + ("its NVLinks to this peer are down: reset the GPU or drain the node" if down else "check nvlink_peers"),
    )


def _bus(bus_id: str) -> str:
    try:
        return normalize_bus_id(bus_id)
    except ValueError:  # a recorded topology with an odd spelling: compared as written
        return bus_id.lower()
