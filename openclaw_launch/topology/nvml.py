"""What NVML says about each GPU, behind a small provider interface.

``PynvmlProvider`` asks the real library (imported lazily: the launcher must
start fast and run where there is no driver). ``RecordedNvml`` replays answers
saved by ``record_nvml`` as JSON, so tests and laptops see a real host's GPUs.
Every query may fail on its own (``NotSupported`` is normal, e.g. the NUMA id on
the H200 host); a failed query is None, not an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from openclaw_launch.errors import TopologyError
from openclaw_launch.limits import MAX_SNAPSHOT_BYTES
from openclaw_launch.safe_read import InputFileError, parse_json, read_input
from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist
from openclaw_launch.topology.model import NvLink, PcieLink, normalize_bus_id

RECORD_FORMAT = "openclaw-nvml-record/1"
_LEVELS = {10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch"}
T = TypeVar("T")
#: NVML's per-link error counters (nvmlNvLinkErrorCounter_t) by the names recordings and checks use:
#: DL replays and recoveries, flit and data CRC errors.
NVLINK_ERROR_COUNTERS: Mapping[str, int] = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


class NvmlUnavailable(TopologyError):
    """NVML cannot be used here (no driver, no library): the host is treated as GPU-less."""


class NvmlProvider(Protocol):
    """The NVML answers discovery needs, per device index. None = unknown / not supported."""

    def device_count(self) -> int: ...
    def uuid(self, index: int) -> str | None: ...
    def pci_bus_id(self, index: int) -> str | None: ...  # as NVML spells it (00000000:0a:00.0)
    def name(self, index: int) -> str | None: ...
    def cpu_affinity(self, index: int) -> tuple[int, ...] | None: ...
    def numa_node(self, index: int) -> int | None: ...
    def nvlinks(self, index: int) -> tuple[NvLink, ...]: ...
    def pcie(self, index: int) -> PcieLink | None: ...
    def retired_pages(self, index: int) -> int | None: ...
    def ecc_uncorrected(self, index: int) -> int | None: ...
    def topology_level(self, a: int, b: int) -> str | None: ...  # PIX/PXB/PHB/NODE/SYS
    def nvlink_p2p(self, a: int, b: int) -> bool | None: ...  # can a reach b over NVLink?


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _remote_bus(raw: object) -> str | None:
    """A link's remote bus id; NVML's all-ones answer (an NVSwitch hidden from a VM) is None."""
    try:
        bus = normalize_bus_id(_text(raw))
    except ValueError:
        return None
    return None if bus.startswith("ffffffff:") else bus


class PynvmlProvider:
    """The live NVML. Raises ``NvmlUnavailable`` from the constructor when it cannot start."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:
            raise NvmlUnavailable(f"pynvml is not installed ({e}); install nvidia-ml-py") from e
        self._nv: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not start ({e}); is the NVIDIA driver loaded?") from e
        self._handles: dict[int, Any] = {}

    def close(self) -> None:
        self._call(self._nv.nvmlShutdown)

    def __enter__(self) -> PynvmlProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., T], *args: object) -> T | None:
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def _h(self, index: int) -> Any:
        """The device handle; None when NVML will not give one (then every query on it is None)."""
        if index not in self._handles:
            self._handles[index] = self._call(self._nv.nvmlDeviceGetHandleByIndex, index)
        return self._handles[index]

    def _dev(self, fn: Callable[..., T], index: int, *args: object) -> T | None:
        h = self._h(index)
        return None if h is None else self._call(fn, h, *args)

    def device_count(self) -> int:
        return int(self._call(self._nv.nvmlDeviceGetCount) or 0)

    def uuid(self, index: int) -> str | None:
        v = self._dev(self._nv.nvmlDeviceGetUUID, index)
        return _text(v) if v is not None else None

    def pci_bus_id(self, index: int) -> str | None:
        info = self._dev(self._nv.nvmlDeviceGetPciInfo, index)
        return _text(info.busId) if info is not None else None

    def name(self, index: int) -> str | None:
        v = self._dev(self._nv.nvmlDeviceGetName, index)
        return _text(v) if v is not None else None

    def cpu_affinity(self, index: int) -> tuple[int, ...] | None:
        words = ((os.cpu_count() or 1) + 63) // 64
        mask = self._dev(self._nv.nvmlDeviceGetCpuAffinity, index, words)
        if mask is None:
            return None
        cpus = tuple(w * 64 + b for w in range(words) for b in range(64) if (int(mask[w]) >> b) & 1)
        return cpus or None

    def numa_node(self, index: int) -> int | None:
        v = self._dev(self._nv.nvmlDeviceGetNumaNodeId, index)
        return int(v) if v is not None and int(v) >= 0 else None

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        """Every link NVML knows on this GPU; links that do not exist answer an error and are skipped."""
        h = self._h(index)
        if h is None:
            return ()
        links: list[NvLink] = []
        for link in range(self._nv.NVML_NVLINK_MAX_LINKS):
            state = self._call(self._nv.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                continue
            remote = self._call(self._nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            kind = self._call(self._nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            version = self._call(self._nv.nvmlDeviceGetNvLinkVersion, h, link)
            errors = {
                name: int(v)
                for name, counter in NVLINK_ERROR_COUNTERS.items()
                if (v := self._call(self._nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)) is not None
            }
            links.append(
                NvLink(
                    link,
                    state == self._nv.NVML_FEATURE_ENABLED,
                    _remote_bus(remote.busId) if remote is not None else None,
                    _REMOTE_TYPES.get(int(kind)) if kind is not None else None,
                    int(version) if version is not None else None,
                    errors or None,
                )
            )
        return tuple(links)

    def pcie(self, index: int) -> PcieLink | None:
        nv = self._nv
        link = PcieLink(
            gen=self._dev(nv.nvmlDeviceGetCurrPcieLinkGeneration, index),
            max_gen=self._dev(nv.nvmlDeviceGetMaxPcieLinkGeneration, index),
            width=self._dev(nv.nvmlDeviceGetCurrPcieLinkWidth, index),
            max_width=self._dev(nv.nvmlDeviceGetMaxPcieLinkWidth, index),
        )
        return None if link == PcieLink(None, None, None, None) else link

    def retired_pages(self, index: int) -> int | None:
        """Pages retired for either cause. Hopper and later remap rows instead: NotSupported -> None."""
        causes = (
            self._nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            self._nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        pages = [self._dev(self._nv.nvmlDeviceGetRetiredPages, index, c) for c in causes]
        return None if any(p is None for p in pages) else sum(len(p or ()) for p in pages)

    def ecc_uncorrected(self, index: int) -> int | None:
        nv = self._nv
        v = self._dev(
            nv.nvmlDeviceGetTotalEccErrors,
            index,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        )
        return int(v) if v is not None else None

    def topology_level(self, a: int, b: int) -> str | None:
        ha, hb = self._h(a), self._h(b)
        if ha is None or hb is None:
            return None
        v = self._call(self._nv.nvmlDeviceGetTopologyCommonAncestor, ha, hb)
        return _LEVELS.get(int(v)) if v is not None else None

    def nvlink_p2p(self, a: int, b: int) -> bool | None:
        ha, hb = self._h(a), self._h(b)
        if ha is None or hb is None:
            return None
        nv = self._nv
        v = self._call(nv.nvmlDeviceGetP2PStatus, ha, hb, nv.NVML_P2P_CAPS_INDEX_NVLINK)
        return v == nv.NVML_P2P_STATUS_OK if v is not None else None


def nvml_available() -> bool:
    """True when NVML starts here. Cheap: a failed start costs a library lookup."""
    try:
        PynvmlProvider().close()
    except NvmlUnavailable:
        return False
    return True


class RecordedNvml:
    """Replays a ``record_nvml`` JSON: the same answers the live host gave."""

    def __init__(self, data: Mapping[str, Any], source: str = "<recorded nvml>") -> None:
        if data.get("format") != RECORD_FORMAT or not isinstance(data.get("devices"), list):
            raise TopologyError(
                f'{source}: not an NVML recording (expected "format": "{RECORD_FORMAT}" and a '
                '"devices" list); record one with openclaw_launch.topology.nvml.record_nvml'
            )
        self._devices: list[Mapping[str, Any]] = data["devices"]
        self._levels: Mapping[str, str | None] = data.get("topology_levels", {})
        self._p2p: Mapping[str, bool | None] = data.get("nvlink_p2p", {})
        self.source = source

    @classmethod
    def load(cls, path: Path) -> RecordedNvml:
        try:
            data = parse_json(read_input(path, "NVML recording", MAX_SNAPSHOT_BYTES))
        except (InputFileError, ValueError) as e:
            raise TopologyError(f"{path}: cannot read the NVML recording: {e}") from e
        if not isinstance(data, dict):
            raise TopologyError(f"{path}: an NVML recording is a JSON object")
        return cls(data, source=str(path))

    def _get(self, index: int, key: str) -> Any:
        return self._devices[index].get(key)

    def device_count(self) -> int:
        return len(self._devices)

    def uuid(self, index: int) -> str | None:
        return self._get(index, "uuid")

    def pci_bus_id(self, index: int) -> str | None:
        return self._get(index, "pci_bus_id")

    def name(self, index: int) -> str | None:
        return self._get(index, "name")

    def cpu_affinity(self, index: int) -> tuple[int, ...] | None:
        v = self._get(index, "cpu_affinity")
        return parse_cpulist(v) if v is not None else None

    def numa_node(self, index: int) -> int | None:
        return self._get(index, "numa_node")

    def nvlinks(self, index: int) -> tuple[NvLink, ...]:
        return tuple(
            NvLink(
                int(link["link"]),
                bool(link["active"]),
                normalize_bus_id(link["remote_bus_id"]) if link.get("remote_bus_id") else None,
                link.get("remote_type"),
                link.get("version"),
                dict(link["errors"]) if link.get("errors") is not None else None,
            )
            for link in self._get(index, "nvlinks") or ()
        )

    def pcie(self, index: int) -> PcieLink | None:
        v = self._get(index, "pcie")
        return PcieLink(v["gen"], v["max_gen"], v["width"], v["max_width"]) if v else None

    def retired_pages(self, index: int) -> int | None:
        return self._get(index, "retired_pages")

    def ecc_uncorrected(self, index: int) -> int | None:
        return self._get(index, "ecc_uncorrected")

    def topology_level(self, a: int, b: int) -> str | None:
        return self._levels.get(f"{min(a, b)},{max(a, b)}")

    def nvlink_p2p(self, a: int, b: int) -> bool | None:
        return self._p2p.get(f"{min(a, b)},{max(a, b)}")


def no_gpus() -> RecordedNvml:
    """A provider that reports no GPUs: for reading a host without touching NVML at all."""
    return RecordedNvml({"format": RECORD_FORMAT, "devices": []}, source="<no GPUs>")


def record_nvml(provider: NvmlProvider, source: str = "") -> dict[str, Any]:
    """Every answer ``provider`` gives, in the JSON ``RecordedNvml`` replays.

    Run on a GPU host: ``json.dump(record_nvml(PynvmlProvider()), f, indent=2)``.
    """
    n = provider.device_count()
    devices = []
    for i in range(n):
        aff = provider.cpu_affinity(i)
        pcie = provider.pcie(i)
        devices.append(
            {
                "index": i,
                "uuid": provider.uuid(i),
                "pci_bus_id": provider.pci_bus_id(i),
                "name": provider.name(i),
                "cpu_affinity": format_cpulist(aff) if aff is not None else None,
                "numa_node": provider.numa_node(i),
                "nvlinks": [
                    {
                        "link": lk.link,
                        "active": lk.active,
                        "remote_bus_id": lk.remote_bus_id,
                        "remote_type": lk.remote_type,
                        "version": lk.version,
                        "errors": dict(lk.errors) if lk.errors is not None else None,
                    }
                    for lk in provider.nvlinks(i)
                ],
                "pcie": None
                if pcie is None
                else {"gen": pcie.gen, "max_gen": pcie.max_gen, "width": pcie.width, "max_width": pcie.max_width},
                "retired_pages": provider.retired_pages(i),
                "ecc_uncorrected": provider.ecc_uncorrected(i),
            }
        )
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    return {
        "format": RECORD_FORMAT,
        "source": source,
        "devices": devices,
        "topology_levels": {f"{a},{b}": provider.topology_level(a, b) for a, b in pairs},
        "nvlink_p2p": {f"{a},{b}": provider.nvlink_p2p(a, b) for a, b in pairs},
    }
