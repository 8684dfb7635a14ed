"""Issue 8: a GPU host whose NVML is broken (driver/library mismatch) must not silently plan CPU
workers with gloo: it fails with NVML's reason (exit 2, before anything starts) wherever NVML is
asked, and CPU mode is asked for explicitly (``--nproc-per-node cpu``). Where the plan needs no NVML
answer and the driver's /proc files list the GPUs, NVML is not started: the GPUs are planned as GPUs
(tests/test_topology_procfs.py). NVML is injected: a provider whose start raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from openclaw_launch.cli.main import cli
from openclaw_launch.topology import live
from openclaw_launch.topology.live import NvmlBroken, discover_topology
from openclaw_launch.topology.nvml import NvmlProvider, NvmlUnavailable
from tests.topo_helpers import write_sysfs

# str() of pynvml's NVMLError_LibRmVersionMismatch (NVML_ERROR_LIB_RM_VERSION_MISMATCH), what nvidia-smi
# reports as "Failed to initialize NVML: Driver/library version mismatch".
RECORDED_REASON = "RM has detected an NVML/RM version mismatch."


def mismatched_nvml() -> NvmlProvider:
    """``PynvmlProvider`` on a host after a driver upgrade without reboot: its start raises."""
    raise NvmlUnavailable(f"NVML could not start ({RECORDED_REASON}); is the NVIDIA driver loaded?")


def _gpu_host(root: Path) -> Path:
    write_sysfs(root, {0: range(4)}, siblings=[(c,) for c in range(4)])
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True)  # the kernel driver is loaded
    return root


def test_driver_present_but_nvml_broken_raises_with_nvmls_reason(tmp_path: Path) -> None:
    with pytest.raises(NvmlBroken) as info:
        discover_topology(_gpu_host(tmp_path), open_nvml=mismatched_nvml)
    text = str(info.value)
    assert RECORDED_REASON in text and "--nproc-per-node cpu" in text and "reboot" in text
    assert info.value.exit_code == 2


def test_no_driver_is_still_a_cpu_host(tmp_path: Path) -> None:
    root = write_sysfs(tmp_path, {0: range(4)}, siblings=[(c,) for c in range(4)])
    topo = discover_topology(root, open_nvml=mismatched_nvml)  # never opened: no driver
    assert topo.gpus == () and topo.numa_nodes == {0: (0, 1, 2, 3)}


@pytest.fixture
def broken_nvml_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This host as a GPU host with a mismatched driver whose /proc files list no GPU: the host's
    tree and NVML are injected."""
    monkeypatch.setattr(live, "HOST_ROOT", _gpu_host(tmp_path / "host"))
    monkeypatch.setattr(live, "PynvmlProvider", mismatched_nvml)


@pytest.mark.usefixtures("broken_nvml_here")
def test_run_fails_with_exit_2_before_anything_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = CliRunner().invoke(cli, ["--nproc-per-node", "2", "--no-python", "--", "touch", str(marker)])
    assert result.exit_code == 2, result.output
    assert RECORDED_REASON in result.output and "--nproc-per-node cpu" in result.output
    assert "Traceback" not in result.output and not marker.exists()
    for args in (["plan", "--json", "train.py"], ["discover"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2 and RECORDED_REASON in result.output, (args, result.output)


@pytest.mark.usefixtures("broken_nvml_here")
def test_cpu_mode_asked_for_explicitly_plans_gloo_workers() -> None:
    result = CliRunner().invoke(cli, ["plan", "--nproc-per-node", "cpu", "--json", "train.py"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["backend"] == "gloo" and plan["ranks"] and all(r["gpu_uuid"] is None for r in plan["ranks"])
