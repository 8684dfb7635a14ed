"""Fabric health in validate, read the way the launcher reads a host: a constructed sysfs tree
(IB ports, the NICs' PCIe links, AER, NUMA) and a recorded NVML with NVLink error counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from openclaw_launch.config.model import Config, GpuSpec, NodeSpec
from openclaw_launch.topology.live import discover_topology
from openclaw_launch.topology.nvml import RECORD_FORMAT, RecordedNvml
from openclaw_launch.topology.snapshot import dump_snapshot, topology_from_snapshot
from openclaw_launch.validate.host import run_checks
from openclaw_launch.validate.results import CheckResult
from tests.topo_helpers import fake_uuid, write_sysfs

BUS = ["0000:1a:00.0", "0000:9a:00.0"]


def _nvml(errors: list[dict[str, int]]) -> RecordedNvml:
    """Two GPUs (NUMA 0 and 1 by sysfs), 2 NVLinks each to the other, with these per-GPU counters on link 0."""
    devices: list[dict[str, Any]] = []
    for i in range(2):
        links = [
            {
                "link": n,
                "active": True,
                "remote_bus_id": BUS[1 - i],
                "remote_type": "gpu",
                "version": 4,
                "errors": errors[i] if n == 0 else {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0},
            }
            for n in range(2)
        ]
        devices.append({"uuid": fake_uuid(i), "pci_bus_id": BUS[i], "name": "NVIDIA H200", "nvlinks": links})
    return RecordedNvml({"format": RECORD_FORMAT, "devices": devices})


def _host(tmp_path: Path, errors: list[dict[str, int]]) -> Any:
    root = write_sysfs(
        tmp_path,
        {0: range(0, 4), 1: range(4, 8)},
        pci={BUS[0]: {"numa_node": "0"}, BUS[1]: {"numa_node": "1"}},
        infiniband={
            "mlx5_0": {1: {"state": "4: ACTIVE", "rate": "400 Gb/sec (4X NDR)", "counters/symbol_error": "0"}},
            "mlx5_1": {1: {"state": "4: ACTIVE", "rate": "200 Gb/sec (4X HDR)", "counters/link_downed": "3"}},
            "mlx5_2": {1: {"state": "1: DOWN", "rate": "10 Gb/sec (4X SDR)"}},
        },
    )
    nic = {
        "mlx5_0": {"numa_node": "0", "current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe"},
        "mlx5_1": {
            "numa_node": "1",
            "current_link_speed": "16.0 GT/s PCIe",
            "max_link_speed": "32.0 GT/s PCIe",
            "current_link_width": "16",
            "max_link_width": "16",
            "aer_dev_nonfatal": "Undefined 0\nTOTAL_ERR_NONFATAL 2\n",
        },
        "mlx5_2": {"numa_node": "3"},
    }
    for dev, files in nic.items():
        for name, text in files.items():
            p = root / "sys/class/infiniband" / dev / "device" / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text + "\n")
    return discover_topology(root, _nvml(errors), allowed_cpus=range(8))


def _config() -> Config:
    gpus = tuple(GpuSpec(uuid=fake_uuid(i)) for i in range(2))
    return Config(nodes=(NodeSpec(name="n0", gpus=gpus),))


def _by(results: list[CheckResult], name: str) -> dict[str, CheckResult]:
    return {r.subject: r for r in results if r.name == name}


def test_ib_rate_nic_pcie_aer_and_numa_from_sysfs(tmp_path: Path) -> None:
    quiet = {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    topo = _host(tmp_path, [quiet, quiet])
    port = next(p for p in topo.infiniband if p.device == "mlx5_1")
    assert (port.rate_gbps, port.numa_node, port.aer) == (200.0, 1, {"nonfatal": 2})
    results = run_checks(_config(), topo, "n0", numactl_path="/usr/bin/numactl")
    rate = _by(results, "ib_port_rate")
    assert rate["mlx5_0 port 1"].status == "pass"
    assert rate["mlx5_1 port 1"].status == "warn" and rate["mlx5_1 port 1"].expected.startswith("400 Gb/s")
    assert "mlx5_2 port 1" not in rate  # a down port is reported by ib_port_state, not by its rate
    assert _by(results, "ib_port_state")["mlx5_2 port 1"].status == "warn"
    assert _by(results, "ib_port_errors")["mlx5_1 port 1"].status == "warn"  # link_downed 3
    pcie = _by(results, "pcie_link")
    assert pcie["mlx5_0"].status == "pass"
    assert pcie["mlx5_1"].status == "warn" and pcie["mlx5_1"].found == "gen4 x16"
    assert _by(results, "pcie_aer")["mlx5_1"].status == "fail"
    numa = _by(results, "nic_numa")
    assert (numa["mlx5_0"].status, numa["mlx5_1"].status, numa["mlx5_2"].status) == ("pass", "pass", "warn")
    assert _by(results, "nvlink_errors")[f"GPU 0 {fake_uuid(0)}"].status == "pass"


def test_nvlink_error_counters_warn_and_survive_a_snapshot(tmp_path: Path) -> None:
    bad = {"replay": 5000, "recovery": 2, "crc_flit": 7, "crc_data": 0}
    quiet = {"replay": 0, "recovery": 0, "crc_flit": 0, "crc_data": 0}
    topo = _host(tmp_path, [quiet, bad])
    again = topology_from_snapshot(json.loads(json.dumps(dump_snapshot(topo))))
    assert again == topo
    checks = _by(run_checks(_config(), again, "n0", numactl_path="/usr/bin/numactl"), "nvlink_errors")
    assert checks[f"GPU 0 {fake_uuid(0)}"].status == "pass"
    warned = checks[f"GPU 1 {fake_uuid(1)}"]
    assert warned.status == "warn"
    assert warned.found == "replay 5000, recovery 2, crc_flit 7, crc_data 0 (mostly link 0)"
