"""The network devices NCCL can use and the one nearest each GPU, from sysfs's PCI tree.

A device's place on PCIe is the path its ``/sys/bus/pci/devices/<bus id>`` link resolves to
(``devices/pci0000:15/0000:15:01.0/0000:16:00.0/.../0000:18:00.0``): its host bridge and the chain
of bridges above it. Two devices that share a bridge below the host bridge sit behind one PCIe
switch (``nvidia-smi topo -m``'s PIX/PXB), and GPUDirect RDMA between them never crosses the CPU.
The nearest NIC of a GPU is therefore, in this order: one behind the same switch (the deepest
shared bridge first: PIX before PXB), one on the same host bridge (PHB), one on the same NUMA node
(NODE), any other (SYS). RDMA devices (``/sys/class/infiniband``) are preferred to plain Ethernet
interfaces, and NICs whose link is known to be down are passed over while another is up.

Everything is read relative to an injected root, as ``topology/sysfs.py``; unreadable is unknown.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from openclaw_launch.topology.model import GpuInfo, Nic, normalize_bus_id

_HOST_BRIDGE_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_BUS_ID_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
#: How far a NIC is from a GPU, nearest first (``NicChoice.tier``).
TIERS: tuple[str, ...] = ("PCIe switch", "host bridge", "NUMA node", "other NUMA node")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def pci_location(device_link: Path) -> tuple[str | None, tuple[str, ...]]:
    """``(host bridge, bus ids from the root port down)`` of the PCI device a sysfs link points at
    (a device directory's own path when it is no link); ``(None, ())`` when the path names none."""
    try:
        real = os.path.realpath(device_link)
    except OSError:
        return None, ()
    root: str | None = None
    path: list[str] = []
    for part in Path(real).parts:
        if _HOST_BRIDGE_RE.match(part):
            root, path = part, []
        elif _BUS_ID_RE.match(part):
            path.append(part)
    return root, tuple(path)


def gpu_pci_location(root: Path, bus_id: str) -> tuple[str | None, tuple[str, ...]]:
    """A GPU's host bridge and PCI path from ``sys/bus/pci/devices/<bus id>``."""
    return pci_location(root / "sys/bus/pci/devices" / normalize_bus_id(bus_id))


def _numa(device: Path) -> int | None:
    text = _read(device / "numa_node")
    try:
        node = int(text) if text is not None else None
    except ValueError:
        return None
    return node if node is not None and node >= 0 else None


def _ib_link(device: Path) -> tuple[bool | None, float | None]:
    """Up when a port is ACTIVE; the speed is the fastest active port's rate in Gb/s."""
    try:
        ports = sorted((device / "ports").iterdir())
    except OSError:
        return None, None
    states = [(_read(p / "state") or "", _read(p / "rate") or "") for p in ports]
    known = [(s, r) for s, r in states if s]
    if not known:
        return None, None
    rates = [_gbps(r) for s, r in known if "ACTIVE" in s.upper()]
    speeds = [r for r in rates if r is not None]
    return bool(rates), max(speeds) if speeds else None


def _gbps(rate: str) -> float | None:
    try:
        return float(rate.split(" ", 1)[0])
    except ValueError:
        return None


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def read_nics(root: Path) -> tuple[Nic, ...]:
    """Every RDMA device, then every network interface on a PCI device that has no RDMA device
    (a RoCE or IPoIB interface is its RDMA device's; virtual interfaces have no ``device``)."""
    nics: list[Nic] = []
    for dev in _entries(root / "sys/class/infiniband"):
        bridge, path = pci_location(dev / "device")
        up, speed = _ib_link(dev)
        bus = path[-1] if path else None
        nics.append(Nic(dev.name, "ib", bus, path, bridge, _numa(dev / "device"), up, speed))
    rdma_buses = {n.pci_bus_id for n in nics}
    for dev in _entries(root / "sys/class/net"):
        if not (dev / "device").exists():
            continue
        bridge, path = pci_location(dev / "device")
        if not path or path[-1] in rdma_buses:
            continue
        state = _read(dev / "operstate")
        speed_mbps = _read(dev / "speed")
        speed = int(speed_mbps) / 1000 if speed_mbps and speed_mbps.isdigit() else None
        up = {"up": True, "down": False}.get(state or "")
        nics.append(Nic(dev.name, "eth", path[-1], path, bridge, _numa(dev / "device"), up, speed))
    return tuple(nics)


@dataclass(frozen=True)
class NicChoice:
    """The NIC a GPU's ranks use, how near it is (``TIERS``), and every NIC as near."""

    nic: Nic
    tier: str
    nearest: tuple[str, ...]


def distance(gpu: GpuInfo, nic: Nic) -> tuple[int, int]:
    """``(tier index, -shared bridges)``: smaller is nearer. Shared bridges below the host bridge
    mean one PCIe switch (a root port has one link, so devices sharing it are behind a switch);
    an unknown PCI path falls back to the NUMA nodes."""
    if gpu.pci_root is not None and gpu.pci_root == nic.root:
        shared = 0
        for a, b in zip(gpu.pci_path, nic.pci_path, strict=False):
            if a != b:
                break
            shared += 1
        return (0, -shared) if shared else (1, 0)
    if gpu.numa_node is not None and gpu.numa_node == nic.numa_node:
        return 2, 0
    return 3, 0


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def assign_nics(gpus: Sequence[GpuInfo], nics: Sequence[Nic]) -> Mapping[int, NicChoice]:
    """GPU index -> its NIC: the nearest (RDMA devices first, down links passed over while one is up);
    among several as near, the one fewest of these GPUs use so far, so the 8 GPUs of a DGX A100,
    two per switch with two NICs, get one NIC each. {} without NICs."""
    rdma = [n for n in nics if n.kind == "ib"]
    pool = rdma or list(nics)
    pool = [n for n in pool if n.link_up is not False] or pool
    used: Counter[str] = Counter()
    out: dict[int, NicChoice] = {}
    for gpu in gpus:
        if not pool:
            break
        best = min(distance(gpu, n) for n in pool)
        nearest = sorted((n for n in pool if distance(gpu, n) == best), key=lambda n: _natural(n.name))
        nic = min(nearest, key=lambda n: used[n.name])
        used[nic.name] += 1
        out[gpu.index] = NicChoice(nic, TIERS[best[0]], tuple(n.name for n in nearest))
    return out
