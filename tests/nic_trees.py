"""Host trees with NICs (``sys/``, ``proc/``, ``dev/``), built from recorded ``nvidia-smi topo -m``
matrices that list NICs, so the nearest-NIC planner reads what a real host's sysfs would show.

The matrix gives every GPU-NIC and NIC-NIC PCIe relation (PIX, PXB, PHB, NODE, SYS). The tree
places the devices so that each relation holds: devices joined by PIX/PXB/PHB share a host bridge
(``pci0000:XX``), by PIX/PXB a PCIe switch under one root port, by PIX a second-level switch below
one of its downstream ports. The NUMA node of a GPU is the matrix's; a NIC's is that of a GPU it is
PIX/PXB/PHB/NODE to (-1 when SYS to every GPU). Bus ids, UUIDs, port states and link speeds are
made up (the matrices do not record them); ``python tests/nic_trees.py`` rewrites the committed
trees under tests/data/sysfs/, and tests/test_topology_nic.py holds them equal to what this builds.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topo_helpers import fake_uuid  # noqa: E402

from openclaw_launch.topology.cpulist import format_cpulist  # noqa: E402
from openclaw_launch.topology.smi import SmiTopo, parse_numactl_hardware, parse_topo_matrix  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
PUBLIC = DATA / "topologies" / "public"


@dataclass(frozen=True)
class TreeSpec:
    """One recorded matrix and what the tree adds to it."""

    stem: str  # tests/data/topologies/public/<stem>.txt
    kind: str  # "ib": RDMA devices; "eth": network interfaces only
    gpu_model: str
    rate: str  # IB port rate, or Ethernet speed in Mb/s
    driver: str | None = None  # /proc/driver/nvidia/version's version, when the source recorded it


TREES: Mapping[str, TreeSpec] = {
    "dgx_a100_nics": TreeSpec(
        "01_dgx_a100_epyc7742_nps4_nic_legend", "ib", "NVIDIA A100-SXM4-40GB", "200 Gb/sec (4X HDR)"
    ),
    "hgx_h100_nics": TreeSpec(
        "03_hgx_h100_8x_xeon8480_ansi_header_11nics", "ib", "NVIDIA H100 80GB HBM3", "400 Gb/sec (4X NDR)", "580.126.20"
    ),
    "asus_4x_ethernet": TreeSpec(
        "10_asus_esc8000a_e12_4x_rtx6000ada_2x_epyc9374f_spaces", "eth", "NVIDIA RTX 6000 Ada Generation", "100000"
    ),
}

_SAME_ROOT = {"PIX", "PXB", "PHB"}
_SAME_SWITCH = {"PIX", "PXB"}


def _groups(devices: list[str], matrix: Mapping[tuple[str, str], str], joined: set[str]) -> list[list[str]]:
    """Devices joined (transitively) by a cell in ``joined``, in matrix order."""
    parent = {d: d for d in devices}

    def find(d: str) -> str:
        while parent[d] != d:
            d = parent[d]
        return d

    for (a, b), cell in matrix.items():
        if a in parent and b in parent and a != b and cell in joined:
            parent[find(b)] = find(a)
    out: dict[str, list[str]] = {}
    for d in devices:
        out.setdefault(find(d), []).append(d)
    return list(out.values())


def _numa_of(smi: SmiTopo) -> dict[str, int]:
    numa = {f"GPU{g.index}": g.numa_affinity for g in smi.gpus if g.numa_affinity is not None}
    for nic in (d for d in smi.devices if d.startswith("NIC")):
        near = [numa[g] for g in numa if smi.matrix.get((g, nic)) in {"PIX", "PXB", "PHB", "NODE"}]
        if near:
            numa[nic] = near[0]
    return numa


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def _numa_cpus(spec: TreeSpec, smi: SmiTopo) -> dict[int, tuple[int, ...]]:
    numactl = PUBLIC / f"{spec.stem}.numactl.txt"
    if numactl.exists():
        return parse_numactl_hardware(numactl.read_text())
    lscpu = PUBLIC / f"{spec.stem}.lscpu.txt"
    if lscpu.exists():
        from openclaw_launch.topology.smi import parse_lscpu

        return dict(parse_lscpu(lscpu.read_text()).numa_nodes)
    return {g.numa_affinity: g.cpu_affinity for g in smi.gpus if g.numa_affinity is not None and g.cpu_affinity}


def placement(smi: SmiTopo) -> tuple[dict[str, str], dict[str, Path]]:
    """Matrix device -> its bus id, and its directory relative to the tree's root."""
    devices = [d for d in smi.devices if d.startswith(("GPU", "NIC"))]
    bus_of: dict[str, str] = {}
    path_of: dict[str, Path] = {}
    buses = iter(range(0x11, 0x100))

    def bridge(above: Path) -> Path:
        return above / f"0000:{next(buses):02x}:00.0"

    for k, complex_ in enumerate(_groups(devices, smi.matrix, _SAME_ROOT)):
        host_bridge = Path("sys/devices") / f"pci0000:{k:02x}"
        for j, switch in enumerate(_groups(complex_, smi.matrix, _SAME_SWITCH)):
            upstream = bridge(host_bridge / f"0000:{k:02x}:{j + 1:02x}.0")  # the root port, then the switch
            for pix in _groups(switch, smi.matrix, {"PIX"}):
                below = bridge(upstream)  # a downstream port
                if len(pix) > 1:  # a second-level switch: PIX is at most one bridge apart
                    below = bridge(below)
                for device in pix:
                    path_of[device] = bridge(bridge(below) if len(pix) > 1 else below)
                    bus_of[device] = path_of[device].name
    return bus_of, path_of


def nic_columns(spec: TreeSpec) -> dict[str, str]:
    """NIC name in the tree -> its column in the recorded matrix (``NIC3``)."""
    smi = parse_topo_matrix((PUBLIC / f"{spec.stem}.txt").read_text())
    bus_of, _ = placement(smi)
    return {nic_name(spec, smi, d, bus_of[d]): d for d in smi.devices if d.startswith("NIC")}


def build_tree(root: Path, spec: TreeSpec) -> None:
    """Write the host tree of ``spec`` at ``root`` (which must not exist)."""
    smi = parse_topo_matrix((PUBLIC / f"{spec.stem}.txt").read_text())
    numa = _numa_of(smi)
    cpus = _numa_cpus(spec, smi)
    bus_of, relative = placement(smi)
    path_of = {device: root / path for device, path in relative.items()}
    for device, path in path_of.items():
        _write(path / "numa_node", f"{numa.get(device, -1)}\n")
        node = numa.get(device)
        if node is not None and node in cpus:
            _write(path / "local_cpulist", format_cpulist(cpus[node]) + "\n")
        _link(root / "sys/bus/pci/devices" / bus_of[device], path)
    _write_gpus(root, spec, smi, bus_of)
    _write_nics(root, spec, smi, bus_of, path_of)
    _write_cpus(root, cpus)


def _write_gpus(root: Path, spec: TreeSpec, smi: SmiTopo, bus_of: Mapping[str, str]) -> None:
    seed = int(spec.stem.split("_")[0])
    for g in smi.gpus:
        bus = bus_of[f"GPU{g.index}"]
        info = (
            f"Model: \t\t {spec.gpu_model}\nGPU UUID: \t {fake_uuid(g.index, seed)}\nBus Location: \t {bus}\n"
            f"Device Minor: \t {g.index}\nGPU Excluded:\t No\n"
        )
        _write(root / "proc/driver/nvidia/gpus" / bus / "information", info)
        _write(root / "dev" / f"nvidia{g.index}", "")
    if spec.driver:
        _write(
            root / "proc/driver/nvidia/version",
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {spec.driver}  Release Build\n",
        )


def nic_name(spec: TreeSpec, smi: SmiTopo, nic: str, bus: str) -> str:
    """The RDMA device's name from the NIC Legend, or the interface name systemd gives the bus id."""
    if spec.kind == "ib":
        return smi.nic_names.get(nic, nic)
    return f"enp{int(bus.split(':')[1], 16)}s0f0"


def _write_nics(
    root: Path, spec: TreeSpec, smi: SmiTopo, bus_of: Mapping[str, str], path_of: Mapping[str, Path]
) -> None:
    for nic in (d for d in smi.devices if d.startswith("NIC")):
        name = nic_name(spec, smi, nic, bus_of[nic])
        if spec.kind == "ib":
            base = root / "sys/class/infiniband" / name
            _link(base / "device", path_of[nic])
            _write(base / "ports/1/state", "4: ACTIVE\n")
            _write(base / "ports/1/phys_state", "5: LinkUp\n")
            _write(base / "ports/1/rate", spec.rate + "\n")
        else:
            base = root / "sys/class/net" / name
            _link(base / "device", path_of[nic])
            _write(base / "operstate", "up\n")
            _write(base / "speed", spec.rate + "\n")


def _write_cpus(root: Path, cpus: Mapping[int, Iterable[int]]) -> None:
    every = sorted({c for cs in cpus.values() for c in cs})
    for node, node_cpus in cpus.items():
        _write(root / f"sys/devices/system/node/node{node}/cpulist", format_cpulist(node_cpus) + "\n")
    _write(root / "sys/devices/system/cpu/online", format_cpulist(every) + "\n")


def tree_listing(root: Path) -> dict[str, str]:
    """Every file's text and every link's target under ``root``, by relative path."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
            full = Path(dirpath) / name
            rel = str(full.relative_to(root))
            out[rel] = f"-> {os.readlink(full)}" if full.is_symlink() else full.read_text()
    return out


if __name__ == "__main__":
    for name, spec in TREES.items():
        target = DATA / "sysfs" / name
        shutil.rmtree(target, ignore_errors=True)
        build_tree(target, spec)
        print(f"wrote {target}")
