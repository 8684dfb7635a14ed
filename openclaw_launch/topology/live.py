"""The live host: the NVIDIA driver's /proc files or NVML for the GPUs, sysfs for everything NUMA.

sysfs is the source of truth for where a GPU sits (NVML's NUMA query is often
NotSupported, as on the H200 host). A caller that needs no NVML-only fact
(``nvml_facts=False``: NVLinks, PCIe levels, ECC) gets the GPUs from the driver's
/proc files where they surely are the GPUs NVML would list (``procfs.usable_driver_gpus``),
without importing pynvml: that is the start path of ``run``. Otherwise, and for
everything else (validate, discover, preflight), NVML. Without a driver the host
is read as GPU-less, with its CPUs and NUMA nodes: the CPU-worker path, silently.
With a driver whose NVML does not start (a driver/library mismatch) nothing is
planned where NVML is asked: ``NvmlBroken`` says why, and CPU mode has to be asked
for. On the /proc path NVML is not started, so its state is not checked there: the
GPUs are still planned as GPUs (never CPU workers with gloo), and a mismatch shows
as the workers' CUDA error.

The real NVML is read in a forked child, which sends the host back as a snapshot (topology/
snapshot.py): NVML's start leaves a thread of the CUDA driver's in its process (``cuda0000...``, it
outlives ``nvmlShutdown``: seen on the H200 host), and the launcher forks and spawns afterwards,
which it does with one thread only (openclaw_launch/single_thread.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from openclaw_launch.errors import TopologyError
from openclaw_launch.single_thread import assert_single_threaded
from openclaw_launch.topology.model import GpuInfo, Topology, normalize_bus_id
from openclaw_launch.topology.nic import gpu_pci_location, read_nics
from openclaw_launch.topology.nvml import NvmlProvider, NvmlUnavailable, PynvmlProvider, no_gpus
from openclaw_launch.topology.procfs import usable_driver_gpus
from openclaw_launch.topology.snapshot import dump_snapshot, topology_from_snapshot
from openclaw_launch.topology.sysfs import SysfsFacts, read_allowed_mems, read_sysfs

#: This host's tree (``proc/``, ``sys/``, ``dev/``); tests point it at a recorded host's.
HOST_ROOT = Path("/")


def _bus(raw: str | None) -> str | None:
    try:
        return normalize_bus_id(raw) if raw else None
    except ValueError:
        return None


def _node_holding(cpus: Iterable[int] | None, numa_nodes: Mapping[int, tuple[int, ...]]) -> int | None:
    """The one NUMA node holding all of ``cpus`` (nvidia-smi's "NUMA Affinity"), else None."""
    want = set(cpus or ())
    nodes = [n for n, c in numa_nodes.items() if want and want <= set(c)]
    return nodes[0] if len(nodes) == 1 else None


def _gpu(i: int, bus: str | None, nvml: NvmlProvider, facts: SysfsFacts, root: Path) -> GpuInfo:
    """One GPU. NUMA node: sysfs, else NVML, else the single node holding the GPU's local CPUs
    (sysfs says -1 in VMs such as the H200 host, where local_cpulist is node 0's CPUs)."""
    pci = facts.pci.get(bus) if bus else None
    affinity = (pci.local_cpus if pci else None) or nvml.cpu_affinity(i)
    numa = pci.numa_node if pci else None
    if numa is None:
        numa = nvml.numa_node(i)
    if numa is None:
        numa = _node_holding(affinity, facts.numa_nodes)
    pci_root, pci_path = gpu_pci_location(root, bus) if bus else (None, ())
    return GpuInfo(
        index=i,
        uuid=nvml.uuid(i),
        pci_bus_id=bus,
        name=nvml.name(i),
        numa_node=numa,
        cpu_affinity=affinity,
        nvlinks=nvml.nvlinks(i),
        pcie=nvml.pcie(i),
        aer=pci.aer if pci else None,
        retired_pages=nvml.retired_pages(i),
        ecc_uncorrected=nvml.ecc_uncorrected(i),
        pci_path=pci_path,
        pci_root=pci_root,
    )


def _links(gpus: tuple[GpuInfo, ...], nvml: NvmlProvider) -> dict[tuple[int, int], str]:
    """``NV<n>`` for GPUs joined by n active links, directly or through NVSwitches;
    otherwise NVML's PCIe level (PIX ... SYS).

    A link ends on a switch when NVML says so or its remote is no GPU here. Two
    GPUs on switches that NVML lets talk over NVLink get the smaller of their
    switch link counts, as nvidia-smi prints NV18 on HGX H100 and on the H200
    host (a VM: its 18 links per GPU end on switches whose bus ids NVML hides).
    """
    index_of = {g.pci_bus_id: g.index for g in gpus if g.pci_bus_id}
    direct: dict[tuple[int, int], int] = {}
    switch: dict[int, int] = {}
    for g in gpus:
        for link in g.nvlinks:
            if not link.active:
                continue
            peer = index_of.get(link.remote_bus_id) if link.remote_bus_id else None
            if peer is not None and peer != g.index:
                direct[(g.index, peer)] = direct.get((g.index, peer), 0) + 1
            elif link.remote_type == "switch" or (peer is None and link.remote_bus_id and not link.remote_type):
                switch[g.index] = switch.get(g.index, 0) + 1
    links: dict[tuple[int, int], str] = {}
    for a in gpus:
        for b in gpus:
            if a.index == b.index:
                continue
            i, j = a.index, b.index
            count = max(direct.get((i, j), 0), direct.get((j, i), 0))
            if nvml.nvlink_p2p(i, j) is not False:
                count += min(switch.get(i, 0), switch.get(j, 0))
            level = f"NV{count}" if count else nvml.topology_level(i, j)
            if level is not None:
                links[(i, j)] = level
    return links


def _discover(root: Path, live: bool, nvml: NvmlProvider, allowed_cpus: Iterable[int] | None) -> Topology:
    buses = [_bus(nvml.pci_bus_id(i)) for i in range(nvml.device_count())]
    facts = read_sysfs(root, [b for b in buses if b])
    if allowed_cpus is not None:
        allowed = tuple(sorted(set(allowed_cpus)))
    elif live:
        allowed = tuple(sorted(os.sched_getaffinity(0)))
    else:
        allowed = facts.cpus  # a recorded tree: this process's affinity says nothing about it
    gpus = tuple(_gpu(i, bus, nvml, facts, root) for i, bus in enumerate(buses))
    return Topology(
        gpus=gpus,
        numa_nodes=facts.numa_nodes,
        allowed_cpus=allowed,
        allowed_mems=read_allowed_mems(root),
        core_of=facts.core_of,
        socket_of=facts.socket_of,
        links=_links(gpus, nvml),
        infiniband=facts.infiniband,
        nics=read_nics(root),
        hostname=socket.gethostname() if live else None,
        source="live" if live else f"sysfs:{root}",
    )


def driver_present(root: Path) -> bool:
    """The NVIDIA kernel driver is loaded (NVML cannot work without it)."""
    return (root / "proc/driver/nvidia").exists() or (root / "dev/nvidiactl").exists()


class NvmlBroken(TopologyError):
    """The NVIDIA driver is there but NVML does not start (e.g. a driver/library version mismatch
    after an upgrade): planning CPU workers with gloo instead would hide it, so nothing starts."""


def broken_nvml_message(where: str, reason: str) -> str:
    return (
        f"{where} has the NVIDIA driver but NVML does not start: {reason}. Fix the driver (after a "
        "driver upgrade, a 'Driver/library version mismatch' needs a reboot or a reload of the nvidia "
        "kernel modules; check with nvidia-smi), or ask for CPU workers explicitly: --nproc-per-node cpu, "
        "or a config node with cpu_workers"
    )


def discover_topology(
    sysfs_root: Path | None = None,
    nvml: NvmlProvider | None = None,
    allowed_cpus: Iterable[int] | None = None,
    open_nvml: Callable[[], NvmlProvider] | None = None,
    *,
    nvml_facts: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Topology:
    """This host (``HOST_ROOT``), or the tree of ``sys/``, ``proc/`` and ``dev/`` at ``sysfs_root``,
    as a ``Topology``.

    ``nvml`` None means: with ``nvml_facts`` False, the driver's /proc files when they serve
    (``environ``, default this process's, says whether Slurm fences devices); else NVML as
    ``open_nvml`` (default: the real NVML) starts it: a host without the NVIDIA driver has no
    GPUs; a host with the driver whose NVML does not start raises ``NvmlBroken`` with NVML's
    reason (CPU mode must be asked for: pass ``nvml.no_gpus()``). A provider passed in is used as
    it is and stays open. ``allowed_cpus`` None means this process's affinity on the live root,
    and all CPUs of the tree for any other root.
    """
    root = HOST_ROOT if sysfs_root is None else Path(sysfs_root)
    live = root == HOST_ROOT
    if nvml is not None:
        return _discover(root, live, nvml, allowed_cpus)
    if not nvml_facts:
        driver_gpus = usable_driver_gpus(root, os.environ if environ is None else environ)
        if driver_gpus is not None:
            return _discover(root, live, driver_gpus, allowed_cpus)
    if not driver_present(root):  # skip pynvml's import and library search: start-up time
        return _discover(root, live, no_gpus(), allowed_cpus)
    if open_nvml is None and live:
        return _discover_apart(root, allowed_cpus)
    return _discover_with(open_nvml or PynvmlProvider, root, live, allowed_cpus)


def _discover_with(
    open_nvml: Callable[[], NvmlProvider], root: Path, live: bool, allowed_cpus: Iterable[int] | None
) -> Topology:
    """The host read with the NVML ``open_nvml`` starts, closed after."""
    try:
        provider = open_nvml()
    except NvmlUnavailable as e:
        raise NvmlBroken(broken_nvml_message("this host" if live else f"the host at {root}", str(e))) from None
    with contextlib.ExitStack() as stack:
        close = getattr(provider, "close", None)
        if close is not None:
            stack.callback(close)
        return _discover(root, live, provider, allowed_cpus)


def _discover_apart(root: Path, allowed_cpus: Iterable[int] | None) -> Topology:
    """This host read with the real NVML in a forked child (NVML's thread stays there), sent back
    as a snapshot, or the ``TopologyError`` it raised (``NvmlBroken`` or another) as its text."""
    assert_single_threaded("fork the NVML reader")
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's stack
        code = 1
        try:
            os.close(read_fd)
            answer: dict[str, object]
            try:
                answer = {"snapshot": dump_snapshot(_discover_with(PynvmlProvider, root, True, allowed_cpus))}
            except TopologyError as e:
                answer = {"error": str(e), "nvml_broken": isinstance(e, NvmlBroken)}
            with os.fdopen(write_fd, "w") as out:
                json.dump(answer, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as answers:
            text = answers.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if not text:
        raise TopologyError(
            f"reading this host's GPUs with NVML failed: its reader (pid {pid}) ended with "
            f"{os.waitstatus_to_exitcode(status)} and no answer (its error, if any, is above)"
        )
    got = json.loads(text)
    if "error" in got:
        raise (NvmlBroken if got["nvml_broken"] else TopologyError)(got["error"])
    return topology_from_snapshot(got["snapshot"], "this host")
