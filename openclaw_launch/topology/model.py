"""The host model every other part reads. Plain frozen data, no I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

_BUS_RE = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:0A:00.0`` (NVML), ``0000:0a:00.0`` (sysfs) or ``0a:00.0`` -> ``0000:0a:00.0``.

    Raises ValueError for text that is not a PCI address.
    """
    m = _BUS_RE.match(bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r} (expected e.g. 0000:0a:00.0)")
    domain, bus, dev, fn = m.groups()
    domain_i = int(domain, 16) if domain else 0
    return f"{domain_i:04x}:{bus.lower()}:{dev.lower()}.{fn}"


#: ``Topology.link_between`` for GPUs whose direct NVLinks are all down.
INACTIVE_NVLINK = "inactive NVLink"


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    remote_bus_id: str | None = None  # normalised; None when NVML could not say
    remote_type: str | None = None  # "gpu", "switch" (NVSwitch), "ibmnpu"; None when NVML could not say
    version: int | None = None  # NVLink generation (1..5) as NVML reports it; None when unknown
    errors: Mapping[str, int] | None = None  # replay / recovery / crc_flit / crc_data totals; None = unknown


@dataclass(frozen=True)
class PcieLink:
    gen: int | None
    max_gen: int | None
    width: int | None
    max_width: int | None


@dataclass(frozen=True)
class IbPort:
    device: str  # e.g. mlx5_0
    port: int
    state: str | None  # e.g. "4: ACTIVE"
    counters: Mapping[str, int] = field(default_factory=dict)  # symbol_error, link_downed, ...
    rate: str | None = None  # sysfs "rate", e.g. "400 Gb/sec (4X NDR)"
    phys_state: str | None = None  # e.g. "5: LinkUp"
    numa_node: int | None = None  # the NIC's PCI device NUMA node (-1 in sysfs is None)
    pcie: PcieLink | None = None  # the NIC's PCIe link (current and max speed/width)
    aer: Mapping[str, int] | None = None  # the NIC's AER totals, as GpuInfo.aer

    @property
    def rate_gbps(self) -> float | None:
        """The port's signalling rate in Gb/s (``400 Gb/sec (4X NDR)`` -> 400.0); None if unreadable."""
        head = (self.rate or "").split(" ", 1)[0]
        try:
            return float(head)
        except ValueError:
            return None


@dataclass(frozen=True)
class Nic:
    """A network device NCCL can use, where it sits on PCIe (``topology/nic.py`` reads them).

    ``kind`` "ib": an RDMA device of ``/sys/class/infiniband`` (InfiniBand or RoCE), chosen with
    ``NCCL_IB_HCA``; "eth": a network interface with a PCI device and no RDMA device on it, chosen
    with ``NCCL_SOCKET_IFNAME``. ``pci_path``: the bus ids from the root port down to the NIC;
    ``root``: its PCI host bridge (``pci0000:15``)."""

    name: str  # mlx5_0 / ens1f0
    kind: str  # "ib" | "eth"
    pci_bus_id: str | None
    pci_path: tuple[str, ...] = ()
    root: str | None = None
    numa_node: int | None = None
    link_up: bool | None = None  # an ACTIVE port / operstate "up"; None: unknown
    speed_gbps: float | None = None  # the fastest active port's rate / the interface's speed


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as found on the host. Unknown facts are None, never guessed."""

    index: int  # NVML / nvidia-smi index
    uuid: str | None
    pci_bus_id: str | None = None  # normalised
    name: str | None = None
    numa_node: int | None = None  # from sysfs; -1 there becomes None
    cpu_affinity: tuple[int, ...] | None = None  # local_cpulist / NVML affinity / smi column
    nvlinks: tuple[NvLink, ...] = ()
    pcie: PcieLink | None = None
    aer: Mapping[str, int] | None = None  # aer_dev_{correctable,nonfatal,fatal} totals
    retired_pages: int | None = None
    ecc_uncorrected: int | None = None
    mps_clients: int | None = None
    pci_path: tuple[str, ...] = ()  # bus ids from the root port down to the GPU (sysfs); () = unknown
    pci_root: str | None = None  # its PCI host bridge (``pci0000:15``); None = unknown


@dataclass(frozen=True)
class Topology:
    """Everything the planner and validator need about one host."""

    gpus: tuple[GpuInfo, ...] = ()
    numa_nodes: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # node -> cpus
    allowed_cpus: tuple[int, ...] = ()  # this process's affinity (cgroup / Slurm cpuset)
    allowed_mems: tuple[int, ...] = ()  # the cpuset's memory nodes (Mems_allowed_list); () = unknown
    core_of: Mapping[int, int] = field(default_factory=dict)  # cpu -> first cpu of its core
    socket_of: Mapping[int, int] = field(default_factory=dict)  # cpu -> physical package
    links: Mapping[tuple[int, int], str] = field(default_factory=dict)  # (gpu i, gpu j) -> NV18/PHB/...
    infiniband: tuple[IbPort, ...] = ()
    nics: tuple[Nic, ...] = ()  # what NCCL can use, with where each sits on PCIe (topology/nic.py)
    hostname: str | None = None
    source: str = "unknown"  # "live", "snapshot:<path>", "smi:<path>"

    def gpu_by_uuid(self, uuid: str) -> GpuInfo | None:
        for g in self.gpus:
            if g.uuid is not None and g.uuid.lower() == uuid.lower():
                return g
        return None

    def link_between(self, a: GpuInfo, b: GpuInfo) -> str | None:
        """The link between two GPUs, as ``plan`` and ``validate`` both judge it (one rule).

        NVML links between ``a`` and ``b``'s buses (either side's) that are all down -> ``INACTIVE_NVLINK``
        (whatever an older link matrix says); else ``NV<n>`` from the link matrix; else ``"NV"``
        when an active NVML link reaches ``b``; else the matrix's PCIe level (PHB, SYS, ...) or None.
        """
        direct = [
            nv
            for x, y in ((a, b), (b, a))
            for nv in x.nvlinks
            if nv.remote_bus_id is not None and nv.remote_bus_id == y.pci_bus_id
        ]
        if direct and not any(nv.active for nv in direct):
            return INACTIVE_NVLINK
        kind = self.links.get((a.index, b.index)) or self.links.get((b.index, a.index))
        if kind is not None and kind.upper().startswith("NV"):
            return kind
        if direct:
            return "NV"
        return kind

    def nvlinked(self, a: GpuInfo, b: GpuInfo) -> bool:
        """Joined by an NVLink that is up (``link_between`` is ``NV...``)."""
        return (self.link_between(a, b) or "").upper().startswith("NV")

    def describe_gpus(self) -> str:
        """One line per GPU, for errors that must list what is there."""
        if not self.gpus:
            return "  (no GPUs found)"
        return "\n".join(
            f"  GPU {g.index}: {g.uuid or '?'} bus {g.pci_bus_id or '?'} "
            f"NUMA {g.numa_node if g.numa_node is not None else 'n/a'}" + (f" ({g.name})" if g.name else "")
            for g in self.gpus
        )
