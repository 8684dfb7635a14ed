"""Which config node this launcher is. Pure decision over injected facts.

Order: ``--node`` > Slurm (``SLURM_NODEID`` indexes the config's nodes; the
hostname from ``SLURMD_NODENAME`` may also name one) > the only node > a node
whose name or ip matches this host's names/addresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from openclaw_launch.config import Config
from openclaw_launch.errors import PlanError


def resolve_node(
    config: Config,
    cli_node: str | None,
    environ: Mapping[str, str],
    host_names: Iterable[str] = (),
    host_addresses: Iterable[str] = (),
) -> str:
    names = [n.name for n in config.nodes]
    if cli_node is not None:
        return config.node(cli_node).name
    slurm_name = environ.get("SLURMD_NODENAME")
    if slurm_name in names:
        return str(slurm_name)
    slurm_id = environ.get("SLURM_NODEID")
    if slurm_id is not None and slurm_id.isdigit():
        idx = int(slurm_id)
        if idx < len(names):
            return names[idx]
        raise PlanError(
            f"SLURM_NODEID={idx} but {config.source} has only {len(names)} node(s) ({', '.join(names)}); "
            "allocate as many Slurm nodes as the config has, or pass --node"
        )
    if len(names) == 1:
        return names[0]
    hosts = {h.lower() for h in host_names} | {h.split(".")[0].lower() for h in host_names}
    addrs = set(host_addresses)
    matches = [n.name for n in config.nodes if n.name.lower() in hosts or (n.ip and n.ip in addrs)]
    if len(matches) == 1:
        return matches[0]
    why = "several nodes match this host" if matches else "no node matches this host's names or addresses"
    raise PlanError(f"{why} in {config.source}; pass --node with one of: {', '.join(matches or names)}")


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
