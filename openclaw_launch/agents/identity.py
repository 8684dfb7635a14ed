"""Which config node this launcher is. Pure decision over injected facts.

Order: ``--node`` > Slurm (``SLURMD_NODENAME`` naming a config node, else that
host's position in the expanded ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST``,
else ``SLURM_NODEID``, indexing the config's nodes) > the only node > a node
whose name or ip matches this host's names/addresses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from openclaw_launch.config.model import Config, NodeSpec
from openclaw_launch.errors import PlanError
from openclaw_launch.limits import listed


def resolve_node(
    config: Config,
    cli_node: str | None,
    environ: Mapping[str, str],
    host_names: Iterable[str] = (),
    host_addresses: Iterable[str] = (),
) -> str:
    """The name of the config node this launcher runs; ``PlanError`` (listing the valid names) if unclear."""
    names = [n.name for n in config.nodes]
    if cli_node is not None:
        return config.node(cli_node).name
    slurm_name = environ.get("SLURMD_NODENAME")
    if slurm_name in names:
        return str(slurm_name)
    slurm_id = _slurm_position(environ) or environ.get("SLURM_NODEID")
    if slurm_id is not None:
        return names[_slurm_index(config, slurm_id.strip(), names)]
    if len(names) == 1:
        return names[0]
    hosts = [h.lower() for h in host_names]
    addrs = {a for a in map(_address, host_addresses) if a is not None}
    matches = [n.name for n in config.nodes if _is_host(n.name.lower(), hosts) or _ip_of(n) in addrs]
    if len(matches) == 1:
        return matches[0]
    why = "several nodes match this host" if matches else "no node matches this host's names or addresses"
    raise PlanError(f"{why} in {config.source}; pass --node with one of: {listed(matches or names)}")


def _slurm_position(environ: Mapping[str, str]) -> str | None:
    """Where this host (``SLURMD_NODENAME``) is in the step's (or job's) expanded hostlist."""
    host = environ.get("SLURMD_NODENAME")
    text = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    if not host or not text:
        return None
    from openclaw_launch.agents.hostlist import parse_hostlist

    try:
        hosts = parse_hostlist(text)
    except PlanError:
        return None
    return str(hosts.index(host)) if host in hosts else None


def _slurm_index(config: Config, slurm_id: str, names: list[str]) -> int:
    """``SLURM_NODEID`` (this node's index in the allocation) as an index into the config's nodes."""
    if not slurm_id.isdigit():
        raise PlanError(f"SLURM_NODEID={slurm_id!r} is not a node index; pass --node with one of: {listed(names)}")
    idx = int(slurm_id)
    if idx >= len(names):
        raise PlanError(
            f"SLURM_NODEID={idx} but {config.source} has only {len(names)} node(s) ({listed(names)}); "
            "allocate as many Slurm nodes as the config has, or pass --node"
        )
    return idx


def _is_host(name: str, hosts: list[str]) -> bool:
    """``name`` is one of ``hosts``, either side possibly unqualified (``gpu1`` is ``gpu1.example``)."""
    short = name.split(".")[0]
    return any(name in (h, h.split(".")[0]) or (short == h and "." not in h) for h in hosts)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address in comparable form (``fe80::1%eth0`` and ``FE80:0::1`` are the same); None if not one."""
    try:
        return ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None


def _ip_of(node: NodeSpec) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    return _address(node.ip) if node.ip else None


def local_identity() -> tuple[list[str], list[str]]:
    """This host's names and IP addresses (the only I/O here; cheap, no DNS lookups)."""
    import socket

    import psutil

    names = [socket.gethostname()]
    addrs = [
        a.address
        for infos in psutil.net_if_addrs().values()
        for a in infos
        if a.family in (socket.AF_INET, socket.AF_INET6)
    ]
    return names, addrs
