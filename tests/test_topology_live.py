from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from topo_helpers import DATA, h200_nvml, load_recorded, write_sysfs

from openclaw_launch.errors import TopologyError
from openclaw_launch.topology.live import discover_topology
from openclaw_launch.topology.model import NvLink, PcieLink
from openclaw_launch.topology.nvml import (
    RECORD_FORMAT,
    NvmlUnavailable,
    PynvmlProvider,
    RecordedNvml,
    no_gpus,
    nvml_available,
    record_nvml,
)

H200_SYSFS = DATA / "sysfs" / "h200x2"
H200_UUIDS = ["GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee", "GPU-593502f1-407a-3b77-45a0-032830195d52"]


def record(devices: list[dict[str, Any]], levels: dict[str, str | None] | None = None) -> RecordedNvml:
    return RecordedNvml({"format": RECORD_FORMAT, "devices": devices, "topology_levels": levels or {}})


def device(i: int, bus: str, **kw: Any) -> dict[str, Any]:
    return {"index": i, "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000", "pci_bus_id": bus, **kw}


def test_recorded_h200_host() -> None:
    topo = discover_topology(H200_SYSFS, h200_nvml())
    assert [g.uuid for g in topo.gpus] == H200_UUIDS
    assert [g.pci_bus_id for g in topo.gpus] == ["0000:00:06.0", "0000:00:07.0"]
    assert [g.name for g in topo.gpus] == ["NVIDIA H200"] * 2
    # sysfs numa_node is -1 there: the node comes from local_cpulist lying in node 0 alone
    assert [g.numa_node for g in topo.gpus] == [0, 0]
    assert [g.cpu_affinity for g in topo.gpus] == [tuple(range(32))] * 2
    assert topo.links == {(0, 1): "NV18", (1, 0): "NV18"}
    g0 = topo.gpus[0]
    # as recorded there: 18 active links per GPU, each to an NVSwitch whose bus id NVML hides
    assert g0.nvlinks == tuple(NvLink(k, True, None, "switch") for k in range(18))
    assert g0.pcie == PcieLink(5, 5, 16, 16)
    assert (g0.retired_pages, g0.ecc_uncorrected, g0.aer) == (None, 0, None)
    assert topo.numa_nodes == {0: tuple(range(32))}
    assert topo.allowed_cpus == tuple(range(32))  # a recorded tree: all its CPUs
    assert topo.hostname is None and topo.source == f"sysfs:{H200_SYSFS}"


def test_live_and_smi_agree_on_the_h200_host() -> None:
    live, smi = discover_topology(H200_SYSFS, h200_nvml()), load_recorded("h200x2")
    for a, b in zip(live.gpus, smi.gpus, strict=True):
        assert (a.uuid, a.numa_node, a.cpu_affinity) == (b.uuid, b.numa_node, b.cpu_affinity)
    assert live.links == smi.links and live.numa_nodes == smi.numa_nodes


def test_allowed_cpus_injected() -> None:
    assert discover_topology(H200_SYSFS, h200_nvml(), allowed_cpus=[3, 1, 1]).allowed_cpus == (1, 3)


def test_sysfs_numa_wins_over_nvml(tmp_path: Path) -> None:
    root = write_sysfs(
        tmp_path,
        numa_nodes={0: [0, 1], 1: [2, 3]},
        pci={"0000:0a:00.0": {"numa_node": "1"}, "0000:0b:00.0": {"numa_node": "-1"}},
    )
    nvml = record(
        [
            device(0, "00000000:0A:00.0", numa_node=0, cpu_affinity="2-3"),
            device(1, "00000000:0B:00.0", numa_node=0, cpu_affinity="0-3"),
            device(2, "00000000:0C:00.0", cpu_affinity="0-3"),  # not in sysfs at all
        ]
    )
    topo = discover_topology(root, nvml)
    # 0: sysfs says 1; 1: sysfs -1, NVML says 0; 2: nothing, affinity spans both nodes -> unknown
    assert [g.numa_node for g in topo.gpus] == [1, 0, None]
    assert topo.gpus[0].cpu_affinity == (2, 3)  # no local_cpulist: NVML's affinity


def test_local_cpulist_wins_over_nvml_affinity(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path, numa_nodes={0: [0, 1], 1: [2, 3]}, pci={"0000:0a:00.0": {"local_cpulist": "2-3"}})
    topo = discover_topology(root, record([device(0, "0000:0a:00.0", cpu_affinity="0-3")]))
    assert topo.gpus[0].cpu_affinity == (2, 3) and topo.gpus[0].numa_node == 1


def test_real_recording_of_the_h200_host() -> None:
    topo = discover_topology(H200_SYSFS, RecordedNvml.load(DATA / "nvml" / "h200x2-live.json"))
    assert topo.links == {(0, 1): "NV18", (1, 0): "NV18"}
    assert [g.numa_node for g in topo.gpus] == [0, 0] and topo.gpus[1].pci_bus_id == "0000:00:07.0"


def test_direct_links_and_partitions(tmp_path: Path) -> None:
    """GPUs 0-1 bridged directly (4 links); 2 and 3 on switches NVML says cannot reach each other."""
    root = write_sysfs(tmp_path, numa_nodes={0: [0, 1]})
    buses = ["0000:1b:00.0", "0000:1c:00.0", "0000:1d:00.0", "0000:1e:00.0"]
    bridge = [[{"link": k, "active": True, "remote_bus_id": buses[1 - i]} for k in range(4)] for i in range(2)]
    to_switch = [{"link": k, "active": True, "remote_bus_id": None, "remote_type": "switch"} for k in range(2)]
    devices = [device(i, buses[i], nvlinks=bridge[i]) for i in range(2)]
    devices += [device(i, buses[i], nvlinks=to_switch) for i in (2, 3)]
    topo = discover_topology(root, record(devices, {"0,1": "PIX", "2,3": "SYS"}))
    assert topo.links[(0, 1)] == topo.links[(1, 0)] == "NV4"
    assert topo.links[(2, 3)] == "NV2"  # NVML said nothing about P2P: the switches are trusted
    nvml = RecordedNvml(
        {"format": RECORD_FORMAT, "devices": devices, "nvlink_p2p": {"2,3": False}, "topology_levels": {"2,3": "SYS"}}
    )
    assert discover_topology(root, nvml).links[(2, 3)] == "SYS"


def test_nvswitch_and_pcie_levels(tmp_path: Path) -> None:
    """HGX: every NVLink ends on a switch (a remote that is no GPU), so all pairs are NV18;
    the fifth GPU has no NVLink and gets NVML's PCIe level."""
    root = write_sysfs(tmp_path, numa_nodes={0: [0, 1]})
    switch = [{"link": k, "active": True, "remote_bus_id": f"00000000:{0xC1 + k % 4:02X}:00.0"} for k in range(18)]
    devices = [device(i, f"0000:{0x1B + i:02x}:00.0", nvlinks=switch) for i in range(4)]
    devices.append(device(4, "0000:9a:00.0", nvlinks=[{"link": 0, "active": False, "remote_bus_id": None}]))
    topo = discover_topology(root, record(devices, {"0,4": "SYS", "1,4": "NODE"}))
    assert topo.links[(0, 3)] == topo.links[(3, 0)] == "NV18"
    assert topo.links[(4, 0)] == "SYS" and topo.links[(1, 4)] == "NODE"
    assert (2, 4) not in topo.links  # NVML said nothing


def test_cpu_only_host(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path, numa_nodes=None, siblings=[(0, 2), (1, 3)])
    topo = discover_topology(root, no_gpus())
    assert topo.gpus == () and topo.links == {}
    assert topo.numa_nodes == {0: (0, 1, 2, 3)} and topo.core_of == {0: 0, 1: 1, 2: 0, 3: 1}


def test_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    if nvml_available():
        pytest.skip("this test is about hosts without an NVIDIA driver")
    topo = discover_topology()
    assert topo.gpus == () and topo.source == "live" and topo.hostname
    assert topo.allowed_cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert set(topo.allowed_cpus) <= {c for cs in topo.numa_nodes.values() for c in cs}
    assert capsys.readouterr() == ("", "")


def test_record_replays_the_same_answers(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(record_nvml(h200_nvml(), source="test")))
    again = RecordedNvml.load(path)
    assert discover_topology(H200_SYSFS, again) == discover_topology(H200_SYSFS, h200_nvml())
    saved = json.loads(path.read_text())
    assert (saved["topology_levels"], saved["nvlink_p2p"]) == ({"0,1": "PHB"}, {"0,1": True})


@pytest.mark.parametrize(
    ("text", "match"),
    [("not json", "cannot read"), ("[1]", "JSON object"), ('{"devices": []}', "not an NVML recording")],
)
def test_bad_recording(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TopologyError, match=match):
        RecordedNvml.load(path)


class _NVMLError(Exception):
    pass


def fake_pynvml(fail_init: bool = False) -> types.ModuleType:
    """A stand-in for the pynvml module: 2 GPUs, NVLink between them, the NUMA id NotSupported."""
    m = types.ModuleType("pynvml")
    buses = [b"00000000:0A:00.0", b"00000000:0B:00.0"]

    def not_supported(*_: object) -> None:
        raise _NVMLError("Not Supported")

    def init() -> None:
        if fail_init:
            raise _NVMLError("Driver Not Loaded")

    def link_state(h: int, link: int) -> int:
        if link >= 2:
            raise _NVMLError("Invalid Argument")
        return 1 if link == 0 else 0

    def affinity(h: int, words: int) -> list[int]:
        return [0b1111 << (4 * h)] + [0] * (words - 1)

    attrs: dict[str, Any] = dict(
        NVMLError=_NVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:08x}-0000-4000-8000-000000000000",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=buses[h]),
        nvmlDeviceGetName=lambda h: b"NVIDIA Fake",
        nvmlDeviceGetCpuAffinity=affinity,
        nvmlDeviceGetNumaNodeId=not_supported,
        NVML_NVLINK_MAX_LINKS=4,
        NVML_FEATURE_ENABLED=1,
        nvmlDeviceGetNvLinkState=link_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: types.SimpleNamespace(busId=buses[1 - h].decode()),
        nvmlDeviceGetNvLinkRemoteDeviceType=lambda h, link: 0 if link == 0 else 0xFF,
        nvmlDeviceGetNvLinkVersion=lambda h, link: 4,
        nvmlDeviceGetNvLinkErrorCounter=lambda h, link, counter: not_supported() if link else 10 * counter + h,
        nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 4 if h else 5,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkWidth=not_supported,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        nvmlDeviceGetRetiredPages=lambda h, cause: [0x1000] if cause else [],
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlDeviceGetTotalEccErrors=not_supported,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 30,
        NVML_P2P_CAPS_INDEX_NVLINK=3,
        NVML_P2P_STATUS_OK=0,
        nvmlDeviceGetP2PStatus=lambda a, b, cap: 0,
    )
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def test_pynvml_provider_handles_errors_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    with PynvmlProvider() as nv:
        assert nv.device_count() == 2
        assert nv.uuid(1) == "GPU-00000001-0000-4000-8000-000000000000"
        assert (nv.pci_bus_id(0), nv.name(0)) == ("00000000:0A:00.0", "NVIDIA Fake")
        assert nv.cpu_affinity(1) == (4, 5, 6, 7)
        assert nv.numa_node(0) is None
        errors = {"replay": 0, "recovery": 10, "crc_flit": 20, "crc_data": 30}  # per-link counters, link 1 none
        assert nv.nvlinks(0) == (
            NvLink(0, True, "0000:0b:00.0", "gpu", 4, errors),
            NvLink(1, False, "0000:0b:00.0", None, 4, None),
        )
        assert nv.pcie(1) == PcieLink(4, 5, 16, None)
        assert (nv.retired_pages(0), nv.ecc_uncorrected(0)) == (1, None)
        assert (nv.topology_level(0, 1), nv.nvlink_p2p(0, 1)) == ("PHB", True)
        rec = record_nvml(nv)
    assert rec["devices"][1]["cpu_affinity"] == "4-7" and rec["topology_levels"] == {"0,1": "PHB"}
    topo = discover_topology(Path("/nonexistent-sysfs"), RecordedNvml(rec))
    assert topo.links == {(0, 1): "NV1", (1, 0): "NV1"}
    assert topo.gpus[1].nvlinks[0].errors == {"replay": 1, "recovery": 11, "crc_flit": 21, "crc_data": 31}
    assert topo.gpus[1].nvlinks[0].version == 4


def test_pynvml_provider_without_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    with pytest.raises(NvmlUnavailable, match="driver"):
        PynvmlProvider()
    assert not nvml_available()
    root = write_sysfs(tmp_path, numa_nodes={0: [0, 1]})
    assert discover_topology(root).gpus == ()
