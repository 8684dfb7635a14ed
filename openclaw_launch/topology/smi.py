"""Parsers for saved ``nvidia-smi topo -m``, ``nvidia-smi -L``, ``numactl --hardware``
and ``lscpu`` text, and the ``Topology`` they describe together.

Operators paste these outputs from machines we cannot reach; they arrive with
ANSI underline codes, tabs expanded to spaces, a collapsed header, empty cells,
NIC columns and legends, and columns older drivers did not print. Cells are
therefore read by position after splitting on whitespace: the matrix has one
cell per header device, and what follows are the affinity columns in header
order (an empty cell is simply not there, so "0\\t\\tN/A" is NUMA 0, GPU NUMA N/A).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from openclaw_launch.errors import TopologyError
from openclaw_launch.limits import MAX_SMI_BYTES
from openclaw_launch.safe_read import InputFileError, read_input
from openclaw_launch.topology.cpulist import cpu_ranges, parse_cpulist
from openclaw_launch.topology.model import GpuInfo, Topology

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_AFFINITY_COLUMNS = {"CPU Affinity": "cpu", "NUMA Affinity": "numa", "GPU NUMA ID": "gpu_numa"}
_CELL_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_LIST_GPU_RE = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*(GPU-[0-9A-Fa-f-]+)\)\s*$")
_LIST_MIG_RE = re.compile(r"^\s+MIG\b.*\(UUID:\s*(MIG-[^)\s]+)\)\s*$")
_NIC_LEGEND_RE = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


@dataclass(frozen=True)
class SmiGpuRow:
    """One GPU row of ``topo -m``. None: the column is absent, empty or says N/A.

    ``numa_nodes`` is the NUMA Affinity column as written: one node, or on Grace-Blackwell-style
    hosts the CPU node together with GPU memory nodes (``0,3-9,11-17``); ``numa_affinity`` is the
    column when it names one node (``topology_from_smi`` picks the CPU-side node of a list)."""

    index: int
    cpu_affinity: tuple[int, ...] | None
    numa_affinity: int | None
    gpu_numa_id: int | None
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class SmiTopo:
    devices: tuple[str, ...]  # matrix columns in order: GPU0.., NIC0.. / mlx5_0..
    matrix: Mapping[tuple[str, str], str]  # (row device, column device) -> X / NV12 / PIX / ...
    gpus: tuple[SmiGpuRow, ...]
    affinity_columns: tuple[str, ...]  # which of "CPU Affinity", ... the header had
    nic_names: Mapping[str, str] = field(default_factory=dict)  # NIC0 -> mlx5_0 (NIC Legend)


@dataclass(frozen=True)
class SmiListGpu:
    index: int
    name: str
    uuid: str
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class LscpuFacts:
    numa_nodes: Mapping[int, tuple[int, ...]]
    threads_per_core: int | None
    sockets: int | None


class SmiTextError(TopologyError):
    """Saved command output that does not parse; ``what`` names the command, so the caller
    that read it from a file can name the file too."""

    def __init__(self, what: str, detail: str):
        self.what = what
        super().__init__(f"{what}: {detail}")


def _bad(what: str, detail: str) -> SmiTextError:
    return SmiTextError(what, detail)


def _opt_int(cell: str | None) -> int | None:
    return int(cell) if cell is not None and cell.isdigit() else None


def _opt_cpus(cell: str | None, row: str) -> tuple[int, ...] | None:
    if cell is None or cell == "N/A":
        return None
    try:
        return parse_cpulist(cell)
    except ValueError as e:
        raise _bad("nvidia-smi topo -m", f"row {row}: CPU Affinity {cell!r}: {e}") from e


def _opt_nodes(cell: str | None, row: str) -> tuple[int, ...]:
    if cell is None or cell == "N/A":
        return ()
    try:
        return parse_cpulist(cell)
    except ValueError as e:
        raise _bad("nvidia-smi topo -m", f"row {row}: NUMA Affinity {cell!r}: {e}") from e


def _row_columns(line: str, n_devices: int, affinity: tuple[str, ...]) -> list[str]:
    """The affinity columns this row has values for, in order. nvidia-smi separates cells with
    tabs: an empty first cell after the matrix is an empty CPU Affinity (a Slurm cgroup or VM
    without CPUs near that GPU), which whitespace splitting alone would lose, shifting the NUMA
    node into the CPU column. Pasted text without tabs is read positionally."""
    columns = [_AFFINITY_COLUMNS[a] for a in affinity]
    cells = line.split("\t")
    if columns[:1] == ["cpu"] and len(cells) > 1 + n_devices and not cells[1 + n_devices].strip():
        return columns[1:]
    return columns


def _header_tokens(header: str) -> list[str]:
    for title in _AFFINITY_COLUMNS:
        header = re.sub(r"\s+".join(title.split()), f"\0{title}\0", header)
    tokens: list[str] = []
    for i, part in enumerate(header.split("\0")):
        tokens += [part] if i % 2 else part.split()
    return tokens


def parse_topo_matrix(text: str) -> SmiTopo:
    """``nvidia-smi topo -m`` text -> devices, link matrix and per-GPU affinities."""
    lines = _ANSI_RE.sub("", text).splitlines()
    body = [ln for ln in lines if ln.strip()]
    if not body or not re.search(r"\bGPU0\b", body[0]):
        raise _bad("nvidia-smi topo -m", "no header line naming GPU0; paste the whole output of the command")
    tokens = _header_tokens(body[0])
    devices = tuple(t for t in tokens if t not in _AFFINITY_COLUMNS)
    affinity = tuple(t for t in tokens if t in _AFFINITY_COLUMNS)
    matrix: dict[tuple[str, str], str] = {}
    gpus: list[SmiGpuRow] = []
    for line in body[1:]:
        cells = line.split()
        if cells[0] == "Legend:":
            break
        if cells[0] not in devices:
            continue
        name, row, rest = cells[0], cells[1 : 1 + len(devices)], cells[1 + len(devices) :]
        if len(row) < len(devices):
            raise _bad("nvidia-smi topo -m", f"row {name} has {len(row)} cells for {len(devices)} devices")
        for col, cell in zip(devices, row, strict=True):
            if not _CELL_RE.match(cell):
                raise _bad("nvidia-smi topo -m", f"row {name}, column {col}: unknown link {cell!r}")
            matrix[(name, col)] = "SYS" if cell == "SOC" else cell
        m = _GPU_RE.match(name)
        if m:
            vals = dict(zip(_row_columns(line, len(devices), affinity), rest, strict=False))  # empty: absent
            nodes = _opt_nodes(vals.get("numa"), name)
            gpus.append(
                SmiGpuRow(
                    index=int(m.group(1)),
                    cpu_affinity=_opt_cpus(vals.get("cpu"), name),
                    numa_affinity=nodes[0] if len(nodes) == 1 else None,
                    gpu_numa_id=_opt_int(vals.get("gpu_numa")),
                    numa_nodes=nodes,
                )
            )
    if not gpus:
        raise _bad("nvidia-smi topo -m", "no GPU rows under the header")
    nics = {m.group(1): m.group(2) for ln in lines if (m := _NIC_LEGEND_RE.match(ln))}
    return SmiTopo(devices, matrix, tuple(gpus), affinity, nics)


def parse_smi_list(text: str) -> tuple[SmiListGpu, ...]:
    """``nvidia-smi -L`` -> GPUs with names and UUIDs; MIG lines are kept under their GPU."""
    gpus: list[SmiListGpu] = []
    for line in _ANSI_RE.sub("", text).splitlines():
        if m := _LIST_GPU_RE.match(line):
            gpus.append(SmiListGpu(int(m.group(1)), m.group(2), m.group(3)))
        elif (mig := _LIST_MIG_RE.match(line)) and gpus:
            last = gpus[-1]
            gpus[-1] = SmiListGpu(last.index, last.name, last.uuid, (*last.mig_uuids, mig.group(1)))
    if not gpus:
        raise _bad("nvidia-smi -L", "no line like 'GPU 0: NVIDIA H200 (UUID: GPU-...)'")
    return tuple(gpus)


def parse_numactl_hardware(text: str) -> dict[int, tuple[int, ...]]:
    """``numactl --hardware`` -> node -> CPUs (memory-only nodes have none and are left out)."""
    nodes: dict[int, tuple[int, ...]] = {}
    for line in text.splitlines():
        m = re.match(r"^node\s+(\d+)\s+cpus:(.*)$", line.strip())
        if m and m.group(2).split():
            nodes[int(m.group(1))] = tuple(sorted(int(c) for c in m.group(2).split()))
    if not nodes:
        raise _bad("numactl --hardware", "no line like 'node 0 cpus: 0 1 2 ...'")
    return nodes


def parse_lscpu(text: str) -> LscpuFacts:
    """The NUMA node CPU lists, threads per core and socket count of ``lscpu`` output."""
    nodes: dict[int, tuple[int, ...]] = {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if m := re.match(r"^NUMA node(\d+) CPU\(s\)$", key):
            try:
                cpus = parse_cpulist(value)
            except ValueError as e:
                raise _bad("lscpu", f"{key}: {e}") from e
            if cpus:
                nodes[int(m.group(1))] = cpus
        else:
            fields[key] = value
    facts = LscpuFacts(nodes, _opt_int(fields.get("Thread(s) per core")), _opt_int(fields.get("Socket(s)")))
    if not nodes and facts.threads_per_core is None and facts.sockets is None:
        raise _bad(
            "lscpu", "no 'Socket(s):', 'Thread(s) per core:' or 'NUMA nodeN CPU(s):' line; paste the whole output"
        )
    return facts


def _sibling_offset(cpus: Iterable[int]) -> int | None:
    """``k`` when ``cpus`` is exactly two equal-length runs ``a-b,a+k-b+k``, else None."""
    runs = cpu_ranges(cpus)
    if len(runs) != 2:
        return None
    (a0, a1), (b0, b1) = runs
    return b0 - a0 if a1 - a0 == b1 - b0 else None


def infer_core_of(cpu_groups: Iterable[Iterable[int]], threads_per_core: int | None) -> dict[int, int]:
    """cpu -> first CPU of its physical core, when only per-node (or per-GPU) CPU lists are known.

    Assumption (Linux on x86): the kernel numbers the first hardware thread of
    every core, then the second threads in the same order, so a group with
    hyperthreads holds two equal-length runs ``a-b,a+k-b+k`` and CPU ``i`` and
    ``i+k`` share a core. A group that is not exactly such a pair of runs
    (one run, interleaved numbering), or ``threads_per_core`` other than 2
    when known, makes each CPU its own core: over-counting cores is the safe
    mistake, it never hides a CPU.
    """
    core_of: dict[int, int] = {}
    for group in cpu_groups:
        cpus = set(group)
        k = _sibling_offset(cpus) if threads_per_core in (None, 2) else None
        for c in sorted(cpus):
            core_of[c] = c - k if k is not None and c - k in cpus else c
    return core_of


def _gpu_nodes(rows: Iterable[SmiGpuRow], home: Mapping[int, int | None]) -> dict[int, tuple[int, ...]]:
    nodes: dict[int, set[int]] = {}
    for g in rows:
        node = home[g.index]
        if node is not None and g.cpu_affinity:
            nodes.setdefault(node, set()).update(g.cpu_affinity)
    return {n: tuple(sorted(c)) for n, c in sorted(nodes.items())}


def _cpu_side_nodes(
    rows: Iterable[SmiGpuRow], cpu_nodes: Mapping[int, tuple[int, ...]] | None
) -> dict[int, int | None]:
    """GPU index -> the NUMA node of its CPUs. A NUMA Affinity list (Grace-Blackwell: the CPU node
    with the GPUs' own memory nodes, ``0,3-9,11-17``) is cut to nodes that are nobody's
    ``GPU NUMA ID`` and, where ``numactl``/``lscpu`` say which nodes have CPUs, to those; several
    left: the one holding the GPU's CPU affinity. Without numactl/lscpu the lowest is taken (the
    kernel numbers CPU nodes before the memory-only nodes of GPU memory). None when unsettled."""
    rows = list(rows)
    memory_nodes = {g.gpu_numa_id for g in rows if g.gpu_numa_id is not None}
    out: dict[int, int | None] = {}
    for g in rows:
        if len(g.numa_nodes) <= 1:
            out[g.index] = g.numa_affinity
            continue
        left = [n for n in g.numa_nodes if n not in memory_nodes]
        if cpu_nodes:
            left = [n for n in left if n in cpu_nodes]
        if len(left) > 1 and cpu_nodes and g.cpu_affinity:
            left = [n for n in left if set(cpu_nodes[n]) & set(g.cpu_affinity)]
        if len(left) > 1 and not cpu_nodes:
            left = left[:1]  # Linux numbers the CPU nodes before the memory-only nodes GPUs add
        out[g.index] = left[0] if len(left) == 1 else None
    return out


def topology_from_smi(
    topo_text: str,
    list_text: str | None = None,
    numactl_text: str | None = None,
    lscpu_text: str | None = None,
    source: str = "smi",
) -> Topology:
    """The host these saved outputs describe.

    UUIDs and names come from ``-L`` (None without it). NUMA nodes come from
    numactl, else lscpu, else the GPUs' NUMA and CPU affinity columns. The
    allowed CPUs are the union of the GPUs' CPU affinities where there are any:
    nvidia-smi prints affinity within the cpuset it ran in (a Slurm job on the
    adroit host shows 6 of a node's 24 CPUs), so that is the nearest record
    of what a launcher there may use; otherwise every known CPU.
    """
    topo = parse_topo_matrix(topo_text)
    listing = {g.index: g for g in parse_smi_list(list_text)} if list_text is not None else None
    if listing is not None and sorted(listing) != sorted(g.index for g in topo.gpus):
        raise TopologyError(
            f"{source}: nvidia-smi -L lists GPUs {sorted(listing)} but topo -m shows "
            f"{sorted(g.index for g in topo.gpus)}; pass both outputs from the same machine"
        )
    lscpu = parse_lscpu(lscpu_text) if lscpu_text is not None else None
    if numactl_text is not None:
        numa_nodes = parse_numactl_hardware(numactl_text)
        home = _cpu_side_nodes(topo.gpus, numa_nodes)
    elif lscpu is not None and lscpu.numa_nodes:
        numa_nodes = dict(lscpu.numa_nodes)
        home = _cpu_side_nodes(topo.gpus, numa_nodes)
    else:
        home = _cpu_side_nodes(topo.gpus, None)
        numa_nodes = _gpu_nodes(topo.gpus, home)
    gpu_cpus = {c for g in topo.gpus for c in g.cpu_affinity or ()}
    node_cpus = {c for cs in numa_nodes.values() for c in cs}
    allowed = tuple(sorted(gpu_cpus or node_cpus))
    threads = lscpu.threads_per_core if lscpu else None
    gpu_only = [set(g.cpu_affinity) - node_cpus for g in topo.gpus if g.cpu_affinity]
    core_of = infer_core_of([*numa_nodes.values(), *(grp for grp in gpu_only if grp)], threads)
    sockets = lscpu.sockets if lscpu else None
    gpus = tuple(
        GpuInfo(
            index=g.index,
            uuid=listing[g.index].uuid if listing else None,
            name=listing[g.index].name if listing else None,
            numa_node=home[g.index],
            cpu_affinity=g.cpu_affinity,
        )
        for g in topo.gpus
    )
    links = {
        (a.index, b.index): topo.matrix[(f"GPU{a.index}", f"GPU{b.index}")]
        for a in topo.gpus
        for b in topo.gpus
        if a.index != b.index
    }
    return Topology(
        gpus=gpus,
        numa_nodes=numa_nodes,
        allowed_cpus=allowed,
        core_of=core_of,
        socket_of={c: 0 for c in gpu_cpus | node_cpus} if sockets == 1 else {},
        links=links,
        source=source,
    )


def _read_text(path: Path, what: str) -> str:
    try:
        return read_input(path, f"saved {what} output", MAX_SMI_BYTES)
    except InputFileError as e:
        raise TopologyError(str(e)) from None


def topology_from_smi_files(
    topo_path: Path,
    list_path: Path | None = None,
    numactl_path: Path | None = None,
    lscpu_path: Path | None = None,
) -> Topology:
    """``topology_from_smi`` on saved files (``discover --from-smi T --smi-list L``); a file
    that does not parse is named in the error."""
    paths = {"nvidia-smi topo -m": topo_path, "nvidia-smi -L": list_path}
    paths |= {"numactl --hardware": numactl_path, "lscpu": lscpu_path}
    texts = {what: _read_text(path, what) if path is not None else None for what, path in paths.items()}
    try:
        return topology_from_smi(
            texts["nvidia-smi topo -m"] or "",
            texts["nvidia-smi -L"],
            texts["numactl --hardware"],
            texts["lscpu"],
            source=f"smi:{topo_path}",
        )
    except SmiTextError as e:
        raise TopologyError(f"{paths[e.what]}: {e}") from None
