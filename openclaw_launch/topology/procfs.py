"""The GPUs the NVIDIA kernel driver publishes under ``/proc/driver/nvidia/gpus``: one directory per
GPU, named by its PCI bus id, whose ``information`` file gives the model, UUID, bus location and
device minor (``/dev/nvidiaN``).

Reading it takes well under a millisecond; NVML costs 70-100 ms on the H200 host (importing pynvml
60-90 ms, ``nvmlInit`` 10-15 ms) and about 30 MiB of memory (in the child that reads it,
topology/live.py, since its start leaves a thread behind). So a plan that needs only
which GPUs there are and where they sit reads them here and asks NVML nothing. ``DriverGpus`` gives
these answers through the ``NvmlProvider`` interface; what only NVML knows (NVLink state and
peers, the PCIe level between GPUs, ECC and retired pages) is unknown (None) there.

The root is injected (``root / "proc/driver/nvidia/gpus"``), as for sysfs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from openclaw_launch.topology.model import NvLink, PcieLink, normalize_bus_id

#: The driver's per-GPU directories, relative to the host root.
DRIVER_GPUS_DIR = "proc/driver/nvidia/gpus"
#: The driver's version file (``NVRM version: NVIDIA UNIX ... Kernel Module for x86_64  580.159.04  ...``).
DRIVER_VERSION_FILE = "proc/driver/nvidia/version"
_DRIVER_VERSION_RE = re.compile(r"^NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", re.M)


@dataclass(frozen=True)
class DriverGpu:
    """One GPU as the kernel driver lists it. ``excluded``: ``GPU Excluded: Yes`` (NVreg_ExcludedGpus):
    the driver keeps it from every client, NVML and CUDA included."""

    bus_id: str  # normalised, from the directory name
    uuid: str | None
    model: str | None
    minor: int | None  # /dev/nvidia<minor>
    excluded: bool


def parse_information(text: str) -> dict[str, str]:
    """``Key:<tabs and spaces>value`` lines -> {key: value} (keys as the driver spells them)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def _driver_gpu(entry: Path) -> DriverGpu | None:
    """One ``gpus/<bus id>`` directory, None when it is no GPU entry we understand."""
    try:
        bus = normalize_bus_id(entry.name)
        text = (entry / "information").read_text(errors="replace")
    except (OSError, ValueError):
        return None
    fields = parse_information(text)
    minor = fields.get("Device Minor", "")
    return DriverGpu(
        bus_id=bus,
        uuid=fields.get("GPU UUID") or None,
        model=fields.get("Model") or None,
        minor=int(minor) if minor.isdigit() else None,
        excluded=fields.get("GPU Excluded", "").lower() == "yes",
    )


def read_driver_gpus(root: Path = Path("/")) -> tuple[DriverGpu, ...] | None:
    """Every GPU the driver lists, in PCI bus order (NVML's index order); None when there is no
    ``gpus`` directory (no driver, or a container that does not show it)."""
    base = root / DRIVER_GPUS_DIR
    try:
        entries = list(base.iterdir())
    except OSError:
        return None
    gpus = (_driver_gpu(e) for e in entries)
    return tuple(sorted((g for g in gpus if g is not None), key=lambda g: g.bus_id))


def read_driver_version(root: Path = Path("/")) -> str | None:
    """The loaded kernel driver's version (``580.159.04``); None without a driver or a line we know."""
    try:
        text = (root / DRIVER_VERSION_FILE).read_text(errors="replace")
    except OSError:
        return None
    m = _DRIVER_VERSION_RE.search(text)
    return m.group(1) if m else None


def minor_to_bus_id(root: Path = Path("/")) -> dict[int, str]:
    """Device minor -> normalised PCI bus id ({} without a driver): how Slurm's GPU numbers
    (``SLURM_STEP_GPUS`` are minors) meet the config's bus ids."""
    return {g.minor: g.bus_id for g in read_driver_gpus(root) or () if g.minor is not None}


class DriverGpus:
    """The ``NvmlProvider`` answers the driver's files hold (count, UUID, bus id, name); every
    NVML-only fact is unknown. Index i is the i-th usable GPU in bus order, as NVML numbers them."""

    def __init__(self, gpus: tuple[DriverGpu, ...]) -> None:
        self._gpus = gpus

    def device_count(self) -> int:
        return len(self._gpus)

    def uuid(self, index: int) -> str | None:
        return self._gpus[index].uuid

    def pci_bus_id(self, index: int) -> str | None:
        return self._gpus[index].bus_id

    def name(self, index: int) -> str | None:
        return self._gpus[index].model

    def cpu_affinity(self, index: int) -> tuple[int, ...] | None:
        return None  # sysfs's local_cpulist

    def numa_node(self, index: int) -> int | None:
        return None  # sysfs's numa_node

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        return ()

    def pcie(self, index: int) -> PcieLink | None:
        return None

    def retired_pages(self, index: int) -> int | None:
        return None

    def ecc_uncorrected(self, index: int) -> int | None:
        return None

    def topology_level(self, a: int, b: int) -> str | None:
        return None

    def nvlink_p2p(self, a: int, b: int) -> bool | None:
        return None


#: Where Slurm lists the GPUs (device minors) it allocated to a step, else to the job. Slurm fences
#: the others with cgroup device rules that the driver's /proc files do not reflect (they list every
#: GPU of the node), while NVML lists only the GPUs this process may open.
SLURM_GPU_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False


def usable_driver_gpus(root: Path, environ: Mapping[str, str]) -> DriverGpus | None:
    """The driver's GPUs when they are surely the GPUs NVML would list here, else None (ask NVML).

    Sure means: the driver lists at least one GPU, each with a UUID, a device minor and its
    ``/dev/nvidia<minor>`` node (a container given only some device nodes sees every GPU in
    /proc), and no Slurm GPU allocation fences devices. Excluded GPUs are left out, as NVML does.
    """
    if any(environ.get(var, "").strip() for var in SLURM_GPU_VARS):
        return None
    usable = tuple(g for g in read_driver_gpus(root) or () if not g.excluded)
    complete = all(g.uuid and g.minor is not None and _exists(root / f"dev/nvidia{g.minor}") for g in usable)
    return DriverGpus(usable) if usable and complete else None
