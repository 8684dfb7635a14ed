"""``runtime.nic_binding: nearest``: each GPU's NIC for the plan (``topology/nic.py`` chooses), and
the plan's warnings about it. No NIC on the host is a warning, not an error: one config serves
every node, NCCL then picks as it does without the key, and ``validate`` says so too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from openclaw_launch.config.model import NodeSpec, Runtime
from openclaw_launch.plan.env import NIC_ENV
from openclaw_launch.topology.model import GpuInfo, Topology
from openclaw_launch.topology.nic import TIERS, NicChoice, assign_nics


def no_nic_message(topology: Topology) -> str:
    return (
        f"runtime.nic_binding: nearest, but {topology.source} has no NIC (no RDMA device under "
        "/sys/class/infiniband, no PCI network interface under /sys/class/net): NCCL picks its NICs itself"
    )


def plan_nics(
    runtime: Runtime, node: NodeSpec, gpus: Sequence[GpuInfo], topology: Topology, base_env: Mapping[str, str]
) -> tuple[Mapping[int, NicChoice], list[str]]:
    """GPU index -> its NIC (empty unless ``nearest``), and the warnings."""
    if runtime.nic_binding != "nearest":
        return {}, []
    if node.is_cpu:
        return {}, [f"runtime.nic_binding: nearest is for GPU ranks; node {node.name} has CPU workers (gloo)"]
    if not topology.nics:
        return {}, [no_nic_message(topology)]
    choices = assign_nics(gpus, topology.nics)
    warnings = []
    for index, choice in sorted(choices.items()):
        if choice.tier == TIERS[-1]:
            warnings.append(
                f"GPU {index}: its nearest NIC {choice.nic.name} is on another NUMA node: its RDMA crosses the "
                "CPU interconnect"
            )
        if choice.nic.link_up is False:
            warnings.append(f"GPU {index}: NIC {choice.nic.name} is down (no NIC of its kind is up)")
    replaced = sorted({NIC_ENV[c.nic.kind] for c in choices.values()})
    given = [v for v in replaced if v in base_env or v in runtime.nccl_env or v in runtime.env]
    if given:
        warnings.append(
            f"runtime.nic_binding: nearest sets {', '.join(given)} per rank; the value given for it is not used"
        )
    return choices, warnings
