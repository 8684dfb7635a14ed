"""Recorded hosts for tests: the saved nvidia-smi outputs as ``Topology`` objects,
made-up ``nvidia-smi -L`` listings for the public ones, and constructed sysfs trees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from openclaw_launch.topology.cpulist import format_cpulist
from openclaw_launch.topology.model import Topology
from openclaw_launch.topology.nvml import RecordedNvml
from openclaw_launch.topology.smi import parse_topo_matrix, topology_from_smi

DATA = Path(__file__).parent / "data"
TOPOLOGIES = DATA / "topologies"
H200_DIR = TOPOLOGIES / "h200x2"


def fake_uuid(i: int, seed: int = 0) -> str:
    """A well-formed, deterministic GPU UUID, distinct per (seed, i)."""
    return f"GPU-{seed:08x}-0000-4000-8000-{i:012x}"


def fake_smi_list(n: int, name: str = "NVIDIA A100-SXM4-40GB", seed: int = 0) -> str:
    """An ``nvidia-smi -L`` listing of ``n`` GPUs with made-up UUIDs."""
    return "".join(f"GPU {i}: {name} (UUID: {fake_uuid(i, seed)})\n" for i in range(n))


def recorded_names() -> list[str]:
    """``"h200x2"`` and the stems of the public topologies (``"01_dgx_a100_..."``)."""
    public = sorted(
        p.name[: -len(".txt")]
        for p in (TOPOLOGIES / "public").glob("*.txt")
        if not p.name.endswith((".numactl.txt", ".lscpu.txt"))
    )
    return ["h200x2", *public]


def _opt(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def recorded_texts(name: str) -> tuple[str, str, str | None, str | None]:
    """``(topo -m, -L, numactl, lscpu)`` texts of a recorded host; ``-L`` made up for public ones.

    ``name`` is ``"h200x2"``, a public stem, or its number prefix (``"05"``).
    """
    if name == "h200x2":
        return (
            (H200_DIR / "nvidia-smi-topo-m.txt").read_text(),
            (H200_DIR / "nvidia-smi-L.txt").read_text(),
            (H200_DIR / "numactl-hardware.txt").read_text(),
            (H200_DIR / "lscpu.txt").read_text(),
        )
    stems = [s for s in recorded_names() if s == name or s.startswith(f"{name}_")]
    if len(stems) != 1:
        raise KeyError(f"no recorded topology {name!r}; have {recorded_names()}")
    base = TOPOLOGIES / "public" / stems[0]
    topo = Path(f"{base}.txt").read_text()
    n = len(parse_topo_matrix(topo).gpus)
    seed = int(stems[0].split("_")[0])
    return topo, fake_smi_list(n, seed=seed), _opt(Path(f"{base}.numactl.txt")), _opt(Path(f"{base}.lscpu.txt"))


def load_recorded(name: str) -> Topology:
    """A recorded host as ``Topology`` (from its smi/numactl/lscpu text, with UUIDs)."""
    topo, listing, numactl, lscpu = recorded_texts(name)
    return topology_from_smi(topo, listing, numactl, lscpu, source=f"smi:{name}")


def h200_nvml() -> RecordedNvml:
    return RecordedNvml.load(DATA / "nvml" / "h200x2.json")


def write_sysfs(
    root: Path,
    numa_nodes: Mapping[int, Iterable[int]] | None,
    siblings: Iterable[Iterable[int]] = (),
    sockets: Mapping[int, int] | None = None,
    pci: Mapping[str, Mapping[str, str]] | None = None,
    infiniband: Mapping[str, Mapping[int, Mapping[str, str]]] | None = None,
) -> Path:
    """Write a minimal sysfs tree under ``root`` and return ``root``.

    ``numa_nodes`` None leaves out ``/sys/devices/system/node`` (a container);
    ``siblings`` groups hyperthreads; ``pci`` maps a bus id to file name -> content;
    ``infiniband`` maps device -> port -> file (``state``, ``counters/NAME``) -> content.
    """

    def put(rel: str, text: str) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")

    groups = [tuple(sorted(g)) for g in siblings]
    all_cpus = sorted({c for g in groups for c in g} | {c for cs in (numa_nodes or {}).values() for c in cs})
    put("sys/devices/system/cpu/online", format_cpulist(all_cpus))
    for node, cpus in (numa_nodes or {}).items():
        put(f"sys/devices/system/node/node{node}/cpulist", format_cpulist(cpus))
    for group in groups:
        for cpu in group:
            put(f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", format_cpulist(group))
            if sockets is not None:
                put(f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", str(sockets[cpu]))
    for bus, files in (pci or {}).items():
        for fname, text in files.items():
            put(f"sys/bus/pci/devices/{bus}/{fname}", text)
    for dev, ports in (infiniband or {}).items():
        for port, files in ports.items():
            for fname, text in files.items():
                put(f"sys/class/infiniband/{dev}/ports/{port}/{fname}", text)
    return root
