"""What the MPS control daemon answers: its servers, their clients, clients per GPU (``mps_status``).

Used by ``validate`` and by ``MpsDaemon.status()``; never raises.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from openclaw_launch.errors import LaunchError
from openclaw_launch.run.mps.control import control_env, daemon_from_pid_file, resolve_control, run_control

_DEVICE_LINE = re.compile(r"\s*\[(\d+)\]")
_CLIENT_LINE = re.compile(r"(\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class MpsServer:
    pid: int
    clients: tuple[int, ...]  # client pids connected to this server


@dataclass(frozen=True)
class MpsStatus:
    """What ``validate`` reports about a daemon: is it answering, who is connected."""

    answering: bool
    daemon_pid: int | None
    servers: tuple[MpsServer, ...] = ()
    device_clients: str | None = None  # raw get_device_client_list output, for humans
    clients_per_gpu: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> clients, where listed
    error: str | None = None  # why it is not answering (the control program's output)

    @property
    def client_count(self) -> int:
        return sum(len(s.clients) for s in self.servers)


def _pids(text: str) -> tuple[int, ...]:
    return tuple(int(tok) for tok in text.split() if tok.isdigit())


def parse_device_clients(text: str, gpu_uuids: Sequence[str]) -> dict[str, int]:
    """GPU UUID -> client count from ``get_device_client_list`` output.

    Driver 580 prints a line ``[<index>] <bus>, <name>`` per device and then one
    ``<pid>.<context>`` line per client context. The index is the daemon's own
    device numbering, i.e. a position in its CUDA_VISIBLE_DEVICES
    (``gpu_uuids``; checked on 2xH200 with the order reversed); devices outside
    it are left out.
    """
    clients: dict[str, set[str]] = {}
    device: str | None = None
    for line in text.splitlines():
        header = _DEVICE_LINE.match(line)
        if header:
            index = int(header.group(1))
            device = gpu_uuids[index] if index < len(gpu_uuids) else None
            if device is not None:
                clients.setdefault(device, set())
            continue
        client = _CLIENT_LINE.fullmatch(line.strip())
        if client and device is not None:
            clients[device].add(client.group(1))
    return {uuid: len(pids) for uuid, pids in clients.items()}


def mps_status(
    pipe_dir: str | os.PathLike[str],
    control: str | None = None,
    timeout_s: float = 5.0,
    base_env: Mapping[str, str] | None = None,
    gpu_uuids: Sequence[str] = (),
) -> MpsStatus:
    """Ask the daemon on ``pipe_dir`` for its servers and their clients. Never raises.

    Servers exist only while clients use MPS, so an idle healthy daemon
    answers with no servers. ``gpu_uuids``: the daemon's CUDA_VISIBLE_DEVICES,
    in order, to tell clients per GPU.
    """
    try:
        binary = resolve_control(control)
    except LaunchError as e:
        return MpsStatus(answering=False, daemon_pid=None, error=str(e))
    pipe_dir = Path(pipe_dir)
    env = control_env(pipe_dir, base_env=base_env)
    daemon = daemon_from_pid_file(pipe_dir, binary)
    listing = run_control(binary, ["get_server_list"], env, timeout_s)
    if listing.returncode != 0:
        return MpsStatus(False, daemon.pid if daemon else None, error=listing.output)
    server_pids = _pids(listing.output)
    servers = []
    for pid in server_pids:
        clients = run_control(binary, [f"get_client_list {pid}"], env, timeout_s)
        servers.append(MpsServer(pid, _pids(clients.output) if clients.returncode == 0 else ()))
    devices = run_control(binary, ["get_device_client_list"], env, timeout_s)
    return MpsStatus(
        answering=True,
        daemon_pid=daemon.pid if daemon else None,
        servers=tuple(servers),
        device_clients=devices.output if devices.returncode == 0 else None,
        clients_per_gpu=parse_device_clients(devices.output, gpu_uuids) if devices.returncode == 0 else {},
    )
