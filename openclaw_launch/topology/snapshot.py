"""A host's ``Topology`` as versioned JSON: recorded with ``discover --snapshot`` on
the real machine, read back anywhere with ``--topology FILE`` so plans and
validation can be computed away from the hardware.

CPU sets are stored as kernel CPU lists (``"0-55,112-167"``) to keep big hosts
readable; link keys are ``"i,j"`` strings because JSON keys are strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from openclaw_launch.errors import TopologyError
from openclaw_launch.files import write_atomic
from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist
from openclaw_launch.topology.model import GpuInfo, IbPort, NvLink, PcieLink, Topology

SCHEMA = "openclaw-topology/1"
_REDO = "re-create it with openclaw-launch discover --snapshot"


def _cpus_out(cpus: tuple[int, ...] | None) -> str | None:
    return format_cpulist(cpus) if cpus is not None else None


def _gpu_out(g: GpuInfo) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "pci_bus_id": g.pci_bus_id,
        "name": g.name,
        "numa_node": g.numa_node,
        "cpu_affinity": _cpus_out(g.cpu_affinity),
        "nvlinks": [
            {
                "link": n.link,
                "active": n.active,
                "remote_bus_id": n.remote_bus_id,
                "remote_type": n.remote_type,
                "version": n.version,
                "errors": dict(n.errors) if n.errors is not None else None,
            }
            for n in g.nvlinks
        ],
        "pcie": _pcie_out(g.pcie),
        "aer": dict(g.aer) if g.aer is not None else None,
        "retired_pages": g.retired_pages,
        "ecc_uncorrected": g.ecc_uncorrected,
        "mps_clients": g.mps_clients,
    }


def _pcie_out(p: PcieLink | None) -> dict[str, int | None] | None:
    return None if p is None else {"gen": p.gen, "max_gen": p.max_gen, "width": p.width, "max_width": p.max_width}


def _pcie_in(p: Mapping[str, Any] | None) -> PcieLink | None:
    return None if p is None else PcieLink(p["gen"], p["max_gen"], p["width"], p["max_width"])


def dump_snapshot(topo: Topology) -> dict[str, Any]:
    """``topo`` as a JSON-ready dict; ``load_snapshot`` gives back an equal ``Topology``."""
    return {
        "schema": SCHEMA,
        "hostname": topo.hostname,
        "source": topo.source,
        "gpus": [_gpu_out(g) for g in topo.gpus],
        "numa_nodes": {str(n): format_cpulist(c) for n, c in sorted(topo.numa_nodes.items())},
        "allowed_cpus": format_cpulist(topo.allowed_cpus),
        "core_of": {str(c): k for c, k in sorted(topo.core_of.items())},
        "socket_of": {str(c): s for c, s in sorted(topo.socket_of.items())},
        "links": {f"{i},{j}": v for (i, j), v in sorted(topo.links.items())},
        "infiniband": [
            {
                "device": p.device,
                "port": p.port,
                "state": p.state,
                "counters": dict(p.counters),
                "rate": p.rate,
                "phys_state": p.phys_state,
                "numa_node": p.numa_node,
                "pcie": _pcie_out(p.pcie),
                "aer": dict(p.aer) if p.aer is not None else None,
            }
            for p in topo.infiniband
        ],
    }


def save_snapshot(topo: Topology, path: Path) -> None:
    """Write atomically (temp file + rename): a reader never sees half a snapshot."""
    write_atomic(path, json.dumps(dump_snapshot(topo), indent=2) + "\n")


def _int_keys(m: Mapping[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in m.items()}


def _gpu_in(d: Mapping[str, Any]) -> GpuInfo:
    pcie = d["pcie"]
    return GpuInfo(
        index=int(d["index"]),
        uuid=d["uuid"],
        pci_bus_id=d["pci_bus_id"],
        name=d["name"],
        numa_node=d["numa_node"],
        cpu_affinity=parse_cpulist(d["cpu_affinity"]) if d["cpu_affinity"] is not None else None,
        nvlinks=tuple(
            NvLink(
                int(n["link"]),
                bool(n["active"]),
                n["remote_bus_id"],
                n["remote_type"],
                n.get("version"),  # absent in snapshots from before they were recorded
                dict(n["errors"]) if n.get("errors") is not None else None,
            )
            for n in d["nvlinks"]
        ),
        pcie=_pcie_in(pcie),
        aer=dict(d["aer"]) if d["aer"] is not None else None,
        retired_pages=d["retired_pages"],
        ecc_uncorrected=d["ecc_uncorrected"],
        mps_clients=d["mps_clients"],
    )


def _link_key(key: str) -> tuple[int, int]:
    i, j = key.split(",")
    return int(i), int(j)


def topology_from_snapshot(data: Mapping[str, Any], where: str = "<snapshot>") -> Topology:
    """The inverse of ``dump_snapshot``; every defect is a ``TopologyError`` naming ``where``."""
    if data.get("schema") != SCHEMA:
        raise TopologyError(
            f"{where}: not a topology snapshot of schema {SCHEMA!r} (found schema {data.get('schema')!r}); {_REDO}"
        )
    try:
        return Topology(
            gpus=tuple(_gpu_in(g) for g in data["gpus"]),
            numa_nodes={n: parse_cpulist(c) for n, c in _int_keys(data["numa_nodes"]).items()},
            allowed_cpus=parse_cpulist(data["allowed_cpus"]),
            core_of={c: int(k) for c, k in _int_keys(data["core_of"]).items()},
            socket_of={c: int(s) for c, s in _int_keys(data["socket_of"]).items()},
            links={_link_key(k): str(v) for k, v in data["links"].items()},
            infiniband=tuple(
                IbPort(
                    p["device"],
                    int(p["port"]),
                    p["state"],
                    dict(p["counters"]),
                    rate=p.get("rate"),  # the fields below: absent in older snapshots
                    phys_state=p.get("phys_state"),
                    numa_node=p.get("numa_node"),
                    pcie=_pcie_in(p.get("pcie")),
                    aer=dict(p["aer"]) if p.get("aer") is not None else None,
                )
                for p in data["infiniband"]
            ),
            hostname=data["hostname"],
            source=str(data["source"]),
        )
    except KeyError as e:
        raise TopologyError(f"{where}: the snapshot lacks the field {e.args[0]!r}; {_REDO}") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise TopologyError(f"{where}: the snapshot is malformed ({e}); {_REDO}") from e


def load_snapshot(path: Path) -> Topology:
    """Read a snapshot file; a missing, non-JSON or outdated file is a ``TopologyError``."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TopologyError(f"{path}: cannot read the topology snapshot ({e.strerror}); {_REDO}") from e
    except ValueError as e:  # not UTF-8
        raise TopologyError(f"{path}: the topology snapshot is not valid JSON ({e}); {_REDO}") from e
    try:
        data = json.loads(text)
    except ValueError as e:
        if any(line.startswith("cluster:") for line in text.splitlines()):
            raise TopologyError(
                f"{path} is a config, not a topology snapshot: give it with --config; --topology takes "
                "the JSON that `openclaw-launch discover --snapshot` writes"
            ) from e
        raise TopologyError(f"{path}: the topology snapshot is not valid JSON ({e}); {_REDO}") from e
    if not isinstance(data, dict):
        raise TopologyError(f"{path}: a topology snapshot is a JSON object; {_REDO}")
    return topology_from_snapshot(data, where=str(path))
