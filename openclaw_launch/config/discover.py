"""A host as a config: ``config_yaml_from_topology`` writes the operators' YAML for
``discover``; ``host_config`` is the in-memory config for "this machine as found"
(``openclaw-launch --nproc-per-node N script.py``, no ``--config``).

Written by hand, not by a YAML library, so the key order is the operators'
(name, ip, gpus; uuid, numa_node, pci_bus_id, nvlink_peers) and the output is
byte-stable. Strings go through ``json.dumps``: a JSON string is a valid YAML
double-quoted scalar, so no value can turn into a number or break the document.
"""

from __future__ import annotations

import json

from openclaw_launch.config.model import Config, GpuSpec, NodeSpec
from openclaw_launch.errors import PlanError, TopologyError
from openclaw_launch.topology.model import GpuInfo, Topology


def _q(text: str) -> str:
    return json.dumps(text)


def _peers(gpu: GpuInfo, topo: Topology) -> list[str]:
    """UUIDs of the GPUs joined to ``gpu`` by NVLink (an ``NV#`` link), in index order."""
    return [
        other.uuid
        for other in topo.gpus
        if other.uuid and other.index != gpu.index and topo.links.get((gpu.index, other.index), "").startswith("NV")
    ]


def _gpu_lines(gpu: GpuInfo, topo: Topology) -> list[str]:
    lines = [
        f"        - uuid: {_q(str(gpu.uuid))}",
        f"          numa_node: {gpu.numa_node if gpu.numa_node is not None else 'null'}",
    ]
    if gpu.pci_bus_id:
        lines.append(f"          pci_bus_id: {_q(gpu.pci_bus_id)}")
    peers = _peers(gpu, topo)
    if peers:
        lines.append(f"          nvlink_peers: [{', '.join(_q(p) for p in peers)}]")
    return lines


def config_yaml_from_topology(topo: Topology, node_name: str, ip: str | None) -> str:
    """The config for this one host; it loads and plans with no edits.

    A host without GPUs becomes a node of ``cpu_workers`` (one per allowed CPU).
    GPUs without UUIDs (``topo -m`` text given without ``nvidia-smi -L``) cannot be
    configured: UUIDs are how the launcher finds GPUs, so that is an error.
    """
    missing = [g.index for g in topo.gpus if not g.uuid]
    if missing:
        raise TopologyError(
            f"GPU(s) {missing} have no UUID ({topo.source}); pass the output of `nvidia-smi -L` from the "
            "same machine with --smi-list LIST.txt"
        )
    host = f" on host {topo.hostname}" if topo.hostname else ""
    lines = [
        f"# Written by openclaw-launch discover from {topo.source}{host}.",
        "# Check it against the machine with: openclaw-launch validate --config THIS_FILE",
        "cluster:",
        "  nodes:",
        f"    - name: {_q(node_name)}",
    ]
    if ip is not None:
        lines.append(f"      ip: {_q(ip)}")
    if topo.gpus:
        lines.append("      gpus:")
        for gpu in sorted(topo.gpus, key=lambda g: g.index):
            lines += _gpu_lines(gpu, topo)
    else:
        lines.append(f"      cpu_workers: {max(1, len(topo.allowed_cpus))}")
    return "\n".join(lines) + "\n"


def host_config(
    topology: Topology,
    nproc_per_node: int | str | None,
    nnodes: int = 1,
) -> Config:
    """This host as a config, as torchrun sees a job: ``nnodes`` identical hosts (node K is ``nodeK``),
    each with ``nproc_per_node`` ranks: N (one per GPU, the first N, or N CPU workers without GPUs),
    ``gpu``, ``cpu`` (one per allowed CPU) or ``auto``. Default: one per GPU, else one CPU worker.
    Only this host's node is planned; the others count ranks. No node has an ip in a multi-node
    job: MASTER_ADDR comes from the command line, or is 127.0.0.1."""
    gpus = [g for g in topology.gpus if g.uuid]
    cpus = max(1, len(topology.allowed_cpus))
    if nproc_per_node == "gpu" and not gpus:
        raise PlanError("--nproc-per-node gpu but this host has no GPU; use a number, cpu or auto")
    use_gpus = bool(gpus) and nproc_per_node != "cpu"
    if use_gpus:
        count = nproc_per_node if isinstance(nproc_per_node, int) else len(gpus)
        if count > len(gpus):
            raise PlanError(
                f"--nproc-per-node {count} but this host has {len(gpus)} GPU(s); "
                "ask for at most that many, or write a config with procs_per_gpu and MPS"
            )
        used = gpus[:count]
        # NVLink peers from this host: every node is this host, and TP groups follow the peers.
        chosen = tuple(
            GpuSpec(
                uuid=str(g.uuid),
                nvlink_peers=tuple(str(p.uuid) for p in used if p is not g and topology.nvlinked(g, p)),
            )
            for g in used
        )
    else:
        workers = nproc_per_node if isinstance(nproc_per_node, int) else cpus if nproc_per_node else 1
    nodes = []
    for k in range(nnodes):
        name = "localhost" if nnodes == 1 else f"node{k}"
        ip = "127.0.0.1" if nnodes == 1 else None
        nodes.append(
            NodeSpec(name=name, ip=ip, gpus=chosen) if use_gpus else NodeSpec(name=name, ip=ip, cpu_workers=workers)
        )
    return Config(nodes=tuple(nodes), source="<this host>")
