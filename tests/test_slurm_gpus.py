"""Slurm's GPU allocation against the config node, from a constructed /proc/driver/nvidia tree
shaped like the driver's (the `information` file of each GPU, as the driver writes it)."""

from __future__ import annotations

from pathlib import Path

from openclaw_launch.agents.slurm_gpus import allocated_minors, slurm_gpu_problems
from openclaw_launch.config.model import GpuSpec, NodeSpec
from openclaw_launch.topology.procfs import minor_to_bus_id

INFORMATION = """Model: \t\t NVIDIA H200
IRQ:   \t\t 222
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.a5.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""
GPUS = [("0000:18:00.0", 0, "GPU-aaaa"), ("0000:2a:00.0", 1, "GPU-bbbb"), ("0000:3a:00.0", 2, "GPU-cccc")]


def _proc(root: Path) -> Path:
    for bus, minor, uuid in GPUS:
        d = root / "proc/driver/nvidia/gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text(INFORMATION.format(uuid=uuid, bus=bus, minor=minor))
    return root


def _node(*which: int) -> NodeSpec:
    gpus = tuple(GpuSpec(uuid=GPUS[i][2], pci_bus_id=GPUS[i][0]) for i in which)
    return NodeSpec(name="n1", ip=None, gpus=gpus)


def test_minors_map_to_bus_ids_and_slurm_lists_are_read() -> None:
    assert allocated_minors({"SLURM_STEP_GPUS": "0,2"}) == (0, 2)
    assert allocated_minors({"SLURM_JOB_GPUS": "1"}) == (1,)
    assert allocated_minors({}) is None and allocated_minors({"SLURM_STEP_GPUS": "gpu:a100:1"}) is None


def test_config_gpus_outside_the_allocation_are_named(tmp_path: Path) -> None:
    root = _proc(tmp_path)
    assert minor_to_bus_id(root) == {0: "0000:18:00.0", 1: "0000:2a:00.0", 2: "0000:3a:00.0"}
    assert slurm_gpu_problems(_node(0, 2), {"SLURM_STEP_GPUS": "0,2"}, root) == []
    [problem] = slurm_gpu_problems(_node(0, 1), {"SLURM_STEP_GPUS": "0,2"}, root)
    assert "GPU-bbbb (0000:2a:00.0)" in problem and "0000:18:00.0, 0000:3a:00.0" in problem


def test_no_driver_no_slurm_or_unknown_minors(tmp_path: Path) -> None:
    assert slurm_gpu_problems(_node(0), {"SLURM_STEP_GPUS": "0"}, tmp_path) == []  # no driver files: unknowable
    assert slurm_gpu_problems(_node(0), {}, _proc(tmp_path)) == []
    [problem] = slurm_gpu_problems(_node(0), {"SLURM_STEP_GPUS": "7"}, tmp_path)
    assert "does not list" in problem
