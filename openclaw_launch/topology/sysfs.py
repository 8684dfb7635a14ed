"""Facts the kernel publishes under ``/sys``: NUMA nodes, CPU cores and sockets,
per-PCI-device NUMA node / local CPUs / AER counters, InfiniBand ports.

Everything is read relative to an injected root so tests feed constructed trees.
A missing or unreadable file means "unknown" (None), never a crash: containers,
VMs and old kernels each leave different parts out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from openclaw_launch.topology.cpulist import parse_cpulist
from openclaw_launch.topology.model import IbPort, PcieLink, normalize_bus_id

_AER_FILES = {
    "correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
    "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL"),
}
_NODE_RE = re.compile(r"^node(\d+)$")
_CPU_RE = re.compile(r"^cpu(\d+)$")


@dataclass(frozen=True)
class PciFacts:
    """One PCI device as sysfs sees it. ``numa_node`` -1 in sysfs is None here."""

    bus_id: str
    present: bool
    numa_node: int | None = None
    local_cpus: tuple[int, ...] | None = None
    aer: Mapping[str, int] | None = None  # correctable / nonfatal / fatal totals


@dataclass(frozen=True)
class SysfsFacts:
    numa_nodes: Mapping[int, tuple[int, ...]]
    cpus: tuple[int, ...]  # every CPU the tree knows (online list, else cpu* dirs)
    core_of: Mapping[int, int]
    socket_of: Mapping[int, int]
    pci: Mapping[str, PciFacts] = field(default_factory=dict)  # normalised bus id -> facts
    infiniband: tuple[IbPort, ...] = ()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _read_cpulist(path: Path) -> tuple[int, ...] | None:
    text = _read(path)
    try:
        return parse_cpulist(text) if text is not None else None
    except ValueError:
        return None


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := pattern.match(p.name))]
    return sorted(found)


def read_cpus(root: Path) -> tuple[int, ...]:
    """All CPUs: ``cpu/online`` when readable, else the ``cpuN`` directories."""
    base = root / "sys/devices/system/cpu"
    online = _read_cpulist(base / "online")
    if online:
        return online
    return tuple(n for n, _ in _numbered(base, _CPU_RE))


def read_numa_nodes(root: Path, cpus: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """node -> CPUs. Nodes without CPUs (memory-only, e.g. HBM) are left out: nothing binds there.

    No node with CPUs (no ``node`` directory in containers, kernels without
    NUMA) means the kernel's own view: one node 0 holding every CPU.
    """
    base = root / "sys/devices/system/node"
    nodes = {n: _read_cpulist(p / "cpulist") for n, p in _numbered(base, _NODE_RE)}
    found = {n: c for n, c in nodes.items() if c}
    if not found and cpus:
        return {0: cpus}
    return found


def read_cpu_topology(root: Path, cpus: Iterable[int]) -> tuple[dict[int, int], dict[int, int]]:
    """``(core_of, socket_of)``: core = smallest hyperthread sibling, socket = physical package.

    A CPU whose topology files are missing is its own core and has no socket entry.
    """
    base = root / "sys/devices/system/cpu"
    core_of: dict[int, int] = {}
    socket_of: dict[int, int] = {}
    for cpu in cpus:
        topo = base / f"cpu{cpu}" / "topology"
        siblings = _read_cpulist(topo / "thread_siblings_list")
        core_of[cpu] = min(siblings) if siblings else cpu
        package = _read_int(topo / "physical_package_id")
        if package is not None and package >= 0:
            socket_of[cpu] = package
    return core_of, socket_of


def _aer_total(path: Path, total_key: str) -> int | None:
    """The ``TOTAL_*`` line of an AER file; the sum of its lines if an older kernel has none."""
    text = _read(path)
    if text is None:
        return None
    counts: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    if total_key in counts:
        return counts[total_key]
    return sum(counts.values()) if counts else None


def read_pci_device(root: Path, bus_id: str) -> PciFacts:
    """NUMA node, local CPUs and AER totals of one PCI device (any bus id spelling)."""
    bus = normalize_bus_id(bus_id)
    dev = root / "sys/bus/pci/devices" / bus
    if not dev.is_dir():
        return PciFacts(bus_id=bus, present=False)
    node = _read_int(dev / "numa_node")
    aer = _aer(dev)
    return PciFacts(
        bus_id=bus,
        present=True,
        numa_node=node if node is not None and node >= 0 else None,
        local_cpus=_read_cpulist(dev / "local_cpulist") or None,
        aer=aer or None,
    )


#: PCIe link speed as sysfs writes it (``16.0 GT/s PCIe``) -> generation.
PCIE_GEN_BY_GTS: Mapping[str, int] = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def _pcie_gen(path: Path) -> int | None:
    text = _read(path)
    return PCIE_GEN_BY_GTS.get(text.split()[0]) if text and text.split() else None


def read_pcie_link(dev: Path) -> PcieLink | None:
    """A PCI device's link from ``current_link_speed/width`` and ``max_link_speed/width``."""
    link = PcieLink(
        gen=_pcie_gen(dev / "current_link_speed"),
        max_gen=_pcie_gen(dev / "max_link_speed"),
        width=_read_int(dev / "current_link_width"),
        max_width=_read_int(dev / "max_link_width"),
    )
    return None if link == PcieLink(None, None, None, None) else link


def _aer(dev: Path) -> dict[str, int] | None:
    aer = {k: v for k, (f, t) in _AER_FILES.items() if (v := _aer_total(dev / f, t)) is not None}
    return aer or None


def read_infiniband(root: Path) -> tuple[IbPort, ...]:
    """Every port under ``/sys/class/infiniband``: state, rate, integer counters, and the NIC's
    PCI facts (NUMA node, link speed/width, AER) from its ``device`` link."""
    base = root / "sys/class/infiniband"
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return ()
    ports: list[IbPort] = []
    for dev in devices:
        pci = dev / "device"
        numa = _read_int(pci / "numa_node")
        nic = {
            "numa_node": numa if numa is not None and numa >= 0 else None,
            "pcie": read_pcie_link(pci),
            "aer": _aer(pci),
        }
        for num, port in _numbered(dev / "ports", re.compile(r"^(\d+)$")):
            state = _read(port / "state")
            counters: dict[str, int] = {}
            try:
                counter_files = sorted(port.joinpath("counters").iterdir())
            except OSError:
                counter_files = []
            for f in counter_files:
                value = _read_int(f)
                if value is not None:
                    counters[f.name] = value
            rate, phys = _read(port / "rate"), _read(port / "phys_state")
            ports.append(
                IbPort(
                    dev.name,
                    num,
                    state.strip() if state else None,
                    counters,
                    rate=rate.strip() if rate else None,
                    phys_state=phys.strip() if phys else None,
                    **nic,  # type: ignore[arg-type]
                )
            )
    return tuple(ports)


def read_allowed_mems(root: Path) -> tuple[int, ...]:
    """The memory nodes this process's cpuset allows (``Mems_allowed_list`` of ``proc/self/status``
    under ``root``); () when unknown (no such file, e.g. a recorded tree without it)."""
    for line in (_read(root / "proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        if key == "Mems_allowed_list":
            try:
                return parse_cpulist(value.strip())
            except ValueError:
                return ()
    return ()


def read_sysfs(root: Path = Path("/"), bus_ids: Iterable[str] = ()) -> SysfsFacts:
    """Everything above in one read; ``bus_ids`` are the PCI devices (GPUs) to look at."""
    cpus = read_cpus(root)
    numa_nodes = read_numa_nodes(root, cpus)
    if not cpus:
        cpus = tuple(sorted({c for cs in numa_nodes.values() for c in cs}))
    core_of, socket_of = read_cpu_topology(root, cpus)
    pci = {f.bus_id: f for f in (read_pci_device(root, b) for b in bus_ids)}
    return SysfsFacts(
        numa_nodes=numa_nodes,
        cpus=cpus,
        core_of=core_of,
        socket_of=socket_of,
        pci=pci,
        infiniband=read_infiniband(root),
    )
