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
from openclaw_launch.limits import MAX_CPU_ID, MAX_SNAPSHOT_BYTES
from openclaw_launch.safe_read import InputFileError, parse_json, read_input
from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist
from openclaw_launch.topology.model import GpuInfo, IbPort, Nic, NvLink, PcieLink, Topology

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
        "pci_path": list(g.pci_path),
        "pci_root": g.pci_root,
    }


def _nic_out(n: Nic) -> dict[str, Any]:
    return {
        "name": n.name,
        "kind": n.kind,
        "pci_bus_id": n.pci_bus_id,
        "pci_path": list(n.pci_path),
        "root": n.root,
        "numa_node": n.numa_node,
        "link_up": n.link_up,
        "speed_gbps": n.speed_gbps,
    }


def _pcie_out(p: PcieLink | None) -> dict[str, int | None] | None:
    return None if p is None else {"gen": p.gen, "max_gen": p.max_gen, "width": p.width, "max_width": p.max_width}


def dump_snapshot(topo: Topology) -> dict[str, Any]:
    """``topo`` as a JSON-ready dict; ``load_snapshot`` gives back an equal ``Topology``."""
    return {
        "schema": SCHEMA,
        "hostname": topo.hostname,
        "source": topo.source,
        "gpus": [_gpu_out(g) for g in topo.gpus],
        "numa_nodes": {str(n): format_cpulist(c) for n, c in sorted(topo.numa_nodes.items())},
        "allowed_cpus": format_cpulist(topo.allowed_cpus),
        "allowed_mems": format_cpulist(topo.allowed_mems),
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
        "nics": [_nic_out(n) for n in topo.nics],
    }


def save_snapshot(topo: Topology, path: Path) -> None:
    """Write atomically (temp file + rename): a reader never sees half a snapshot."""
    write_atomic(path, json.dumps(dump_snapshot(topo), indent=2) + "\n")


class _Bad(Exception):
    """A field of the snapshot with the wrong type: its path and what it should be."""

    def __init__(self, path: str, expected: str, value: object) -> None:
        shown = repr(value)
        super().__init__(f"{path}: expected {expected}, found {shown[:60]}{'...' if len(shown) > 60 else ''}")


def _get(d: Any, key: str, path: str) -> Any:
    if not isinstance(d, Mapping):
        raise _Bad(path, "an object", d)
    if key not in d:
        raise KeyError(f"{path}.{key}" if path else key)
    return d[key]


def _int(v: Any, path: str, lo: int = 0, hi: int = 1 << 31, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _Bad(path, f"an integer {lo}..{hi}" + (" or null" if optional else ""), v)
    return v


def _str(v: Any, path: str, optional: bool = False) -> Any:
    if v is None and optional:
        return None
    if not isinstance(v, str) or len(v) > 4096:
        raise _Bad(path, "a string" + (" or null" if optional else ""), v)
    return v


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise _Bad(path, "a list", v)
    return v


def _map(v: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise _Bad(path, "an object", v)
    return v


def _cpus(v: Any, path: str) -> tuple[int, ...]:
    try:
        return parse_cpulist(_str(v, path))
    except ValueError as e:
        raise _Bad(path, f"a CPU list ({e})", v) from None


def _int_keys(m: Any, path: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for k, v in _map(m, path).items():
        if not (isinstance(k, str) and k.isdigit() and int(k) <= MAX_CPU_ID):
            raise _Bad(f"{path} key", f"a number 0..{MAX_CPU_ID}", k)
        out[int(k)] = v
    return out


def _counters(v: Any, path: str) -> dict[str, int]:
    return {str(k): _int(n, f"{path}.{k}", hi=1 << 62) for k, n in _map(v, path).items()}


def _pcie(v: Any, path: str) -> PcieLink | None:
    if v is None:
        return None
    keys = ("gen", "max_gen", "width", "max_width")
    return PcieLink(*(_int(_get(v, k, path), f"{path}.{k}", optional=True) for k in keys))


def _gpu_in(d: Any, p: str) -> GpuInfo:
    pcie = _get(d, "pcie", p)
    aer = _get(d, "aer", p)
    affinity = _get(d, "cpu_affinity", p)
    nvlinks = []
    for i, n in enumerate(_list(_get(d, "nvlinks", p), f"{p}.nvlinks")):
        q = f"{p}.nvlinks[{i}]"
        active = _get(n, "active", q)
        if not isinstance(active, bool):
            raise _Bad(f"{q}.active", "true or false", active)
        errors = n.get("errors") if isinstance(n, Mapping) else None  # absent before they were recorded
        nvlinks.append(
            NvLink(
                _int(_get(n, "link", q), f"{q}.link"),
                active,
                _str(_get(n, "remote_bus_id", q), f"{q}.remote_bus_id", optional=True),
                _str(_get(n, "remote_type", q), f"{q}.remote_type", optional=True),
                _int(n.get("version"), f"{q}.version", optional=True),
                None if errors is None else _counters(errors, f"{q}.errors"),
            )
        )
    pcie = _pcie(pcie, f"{p}.pcie")
    if aer is not None:
        aer = _counters(aer, f"{p}.aer")
    return GpuInfo(
        index=_int(_get(d, "index", p), f"{p}.index", hi=MAX_CPU_ID),
        uuid=_str(_get(d, "uuid", p), f"{p}.uuid", optional=True),
        pci_bus_id=_str(_get(d, "pci_bus_id", p), f"{p}.pci_bus_id", optional=True),
        name=_str(_get(d, "name", p), f"{p}.name", optional=True),
        numa_node=_int(_get(d, "numa_node", p), f"{p}.numa_node", hi=MAX_CPU_ID, optional=True),
        cpu_affinity=_cpus(affinity, f"{p}.cpu_affinity") if affinity is not None else None,
        nvlinks=tuple(nvlinks),
        pcie=pcie,
        aer=aer,
        retired_pages=_int(_get(d, "retired_pages", p), f"{p}.retired_pages", hi=1 << 62, optional=True),
        ecc_uncorrected=_int(_get(d, "ecc_uncorrected", p), f"{p}.ecc_uncorrected", hi=1 << 62, optional=True),
        mps_clients=_int(_get(d, "mps_clients", p), f"{p}.mps_clients", hi=1 << 20, optional=True),
        # absent in snapshots from before they were recorded: unknown, the NUMA node decides
        pci_path=_bus_path(d.get("pci_path", []), f"{p}.pci_path"),
        pci_root=_str(d.get("pci_root"), f"{p}.pci_root", optional=True),
    )


def _bus_path(v: Any, path: str) -> tuple[str, ...]:
    return tuple(_str(b, f"{path}[{i}]") for i, b in enumerate(_list(v, path)))


def _nic_in(d: Any, p: str) -> Nic:
    kind = _str(_get(d, "kind", p), f"{p}.kind")
    if kind not in ("ib", "eth"):
        raise _Bad(f"{p}.kind", "'ib' or 'eth'", kind)
    link_up = d.get("link_up")
    if link_up is not None and not isinstance(link_up, bool):
        raise _Bad(f"{p}.link_up", "true, false or null", link_up)
    speed = d.get("speed_gbps")
    if speed is not None and (isinstance(speed, bool) or not isinstance(speed, int | float)):
        raise _Bad(f"{p}.speed_gbps", "a number or null", speed)
    return Nic(
        name=_str(_get(d, "name", p), f"{p}.name"),
        kind=kind,
        pci_bus_id=_str(d.get("pci_bus_id"), f"{p}.pci_bus_id", optional=True),
        pci_path=_bus_path(d.get("pci_path", []), f"{p}.pci_path"),
        root=_str(d.get("root"), f"{p}.root", optional=True),
        numa_node=_int(d.get("numa_node"), f"{p}.numa_node", hi=MAX_CPU_ID, optional=True),
        link_up=link_up,
        speed_gbps=None if speed is None else float(speed),
    )


def _link_key(key: str) -> tuple[int, int]:
    i, j = key.split(",")
    return int(i), int(j)


def topology_from_snapshot(data: Mapping[str, Any], where: str = "<snapshot>") -> Topology:
    """The inverse of ``dump_snapshot``; every defect is a ``TopologyError`` naming ``where`` and the
    field's path."""
    if data.get("schema") != SCHEMA:
        raise TopologyError(
            f"{where}: not a topology snapshot of schema {SCHEMA!r} (found schema {data.get('schema')!r}); {_REDO}"
        )
    try:
        ib = []
        for i, port in enumerate(_list(_get(data, "infiniband", ""), "infiniband")):
            q = f"infiniband[{i}]"
            counters = _map(_get(port, "counters", q), f"{q}.counters")
            ib.append(
                IbPort(
                    _str(_get(port, "device", q), f"{q}.device"),
                    _int(_get(port, "port", q), f"{q}.port"),
                    _str(_get(port, "state", q), f"{q}.state", optional=True),
                    _counters(counters, f"{q}.counters"),
                    # the fields below are absent in snapshots from before they were recorded
                    rate=_str(port.get("rate"), f"{q}.rate", optional=True),
                    phys_state=_str(port.get("phys_state"), f"{q}.phys_state", optional=True),
                    numa_node=_int(port.get("numa_node"), f"{q}.numa_node", hi=MAX_CPU_ID, optional=True),
                    pcie=_pcie(port.get("pcie"), f"{q}.pcie"),
                    aer=None if port.get("aer") is None else _counters(port["aer"], f"{q}.aer"),
                )
            )
        return Topology(
            gpus=tuple(_gpu_in(g, f"gpus[{i}]") for i, g in enumerate(_list(_get(data, "gpus", ""), "gpus"))),
            numa_nodes={
                n: _cpus(c, f"numa_nodes.{n}") for n, c in _int_keys(_get(data, "numa_nodes", ""), "numa_nodes").items()
            },
            allowed_cpus=_cpus(_get(data, "allowed_cpus", ""), "allowed_cpus"),
            # absent in snapshots from before it was recorded: unknown, nothing is checked against it
            allowed_mems=_cpus(data.get("allowed_mems", ""), "allowed_mems"),
            core_of={
                c: _int(k, f"core_of.{c}", hi=MAX_CPU_ID)
                for c, k in _int_keys(_get(data, "core_of", ""), "core_of").items()
            },
            socket_of={
                c: _int(s, f"socket_of.{c}", hi=MAX_CPU_ID)
                for c, s in _int_keys(_get(data, "socket_of", ""), "socket_of").items()
            },
            links={_link_key(k): str(v) for k, v in _map(_get(data, "links", ""), "links").items()},
            infiniband=tuple(ib),
            nics=tuple(_nic_in(n, f"nics[{i}]") for i, n in enumerate(_list(data.get("nics", []), "nics"))),
            hostname=_str(_get(data, "hostname", ""), "hostname", optional=True),
            source=str(_get(data, "source", "")),
        )
    except _Bad as e:
        raise TopologyError(f"{where}: {e}; {_REDO}") from None
    except KeyError as e:
        raise TopologyError(f"{where}: the snapshot lacks the field {e.args[0]!r}; {_REDO}") from e
    except (TypeError, ValueError, AttributeError) as e:
        raise TopologyError(f"{where}: the snapshot is malformed ({e}); {_REDO}") from e


def load_snapshot(path: Path) -> Topology:
    """Read a snapshot file; a missing, non-JSON or outdated file is a ``TopologyError``."""
    try:
        text = read_input(path, "topology snapshot", MAX_SNAPSHOT_BYTES)
    except InputFileError as e:
        raise TopologyError(f"{e}; {_REDO}") from None
    try:
        data = parse_json(text)
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
