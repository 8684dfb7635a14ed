"""Slurm's GPU allocation against the config: a step given other GPUs than its config node lists
must not start (its ranks would run on GPUs Slurm gave to another job).

Slurm names allocated GPUs by device minor number (`SLURM_STEP_GPUS`, else `SLURM_JOB_GPUS`:
`/dev/nvidiaN`), which is not NVML's index. The NVIDIA driver maps minors to PCI bus ids in
`/proc/driver/nvidia/gpus/<bus id>/information` ("Device Minor: N"); the config names GPUs by
UUID and bus id. Reading is injected (``root``); the comparison is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from openclaw_launch.config.model import NodeSpec
from openclaw_launch.topology.model import normalize_bus_id
from openclaw_launch.topology.procfs import SLURM_GPU_VARS, minor_to_bus_id


def allocated_minors(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """The device minors Slurm allocated to this step, or None outside a GPU allocation."""
    for var in SLURM_GPU_VARS:
        text = environ.get(var, "").strip()
        if text:
            minors = [part.strip() for part in text.split(",")]
            if all(m.isdigit() for m in minors):
                return tuple(int(m) for m in minors)
            return None  # a form we do not know (e.g. a GRES type prefix): say nothing rather than guess
    return None


def allocation_problems(node: NodeSpec, minors: Sequence[int], bus_of_minor: Mapping[int, str]) -> list[str]:
    """What in the config node is outside Slurm's allocation (empty: consistent, or unknowable)."""
    if node.is_cpu or not bus_of_minor:
        return []
    allocated = {bus_of_minor[m] for m in minors if m in bus_of_minor}
    unknown = [m for m in minors if m not in bus_of_minor]
    if unknown:
        return [f"Slurm allocated GPU minor(s) {unknown} that the driver does not list; cannot check the allocation"]
    outside = [
        f"{g.uuid} ({g.pci_bus_id})"
        for g in node.gpus
        if g.pci_bus_id is not None and normalize_bus_id(g.pci_bus_id) not in allocated
    ]
    if not outside:
        return []
    return [
        f"node {node.name}: the config lists GPU(s) {', '.join(outside)} but Slurm gave this step only "
        f"{', '.join(sorted(allocated)) or 'no GPU'} (SLURM_STEP_GPUS minors {list(minors)}); ask Slurm for "
        "the node's GPUs (--gres=gpu:N, --exclusive) or list only the allocated ones in the config"
    ]


def slurm_gpu_problems(node: NodeSpec, environ: Mapping[str, str], root: Path = Path("/")) -> list[str]:
    minors = allocated_minors(environ)
    if minors is None:
        return []
    return allocation_problems(node, minors, minor_to_bus_id(root))
