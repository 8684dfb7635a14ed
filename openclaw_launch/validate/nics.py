"""``runtime.nic_binding: nearest`` checked on the host: each GPU's NIC as the plan chooses it
(``topology/nic.py``), its link up and as fast as the fastest NIC the node's GPUs use."""

from __future__ import annotations

from openclaw_launch.config.model import NodeSpec, Runtime
from openclaw_launch.plan.nics import no_nic_message
from openclaw_launch.topology.model import Topology
from openclaw_launch.topology.nic import TIERS, assign_nics
from openclaw_launch.validate.results import CheckResult


def nic_binding_checks(spec: NodeSpec, runtime: Runtime, topology: Topology) -> list[CheckResult]:
    """One ``nic_binding`` result per configured GPU (none unless ``nearest``)."""
    if runtime.nic_binding != "nearest" or spec.is_cpu:
        return []
    if not topology.nics:
        return [CheckResult("nic_binding", "warn", spec.name, "no NIC", "a NIC per GPU", no_nic_message(topology))]
    gpus = [g for s in spec.gpus if (g := topology.gpu_by_uuid(s.uuid)) is not None]
    choices = assign_nics(gpus, topology.nics)
    fastest = max((c.nic.speed_gbps or 0.0 for c in choices.values() if c.nic.link_up), default=0.0)
    results = []
    for gpu in gpus:
        choice = choices[gpu.index]
        nic = choice.nic
        subject = f"GPU {gpu.index} {gpu.uuid or ''}".rstrip()
        speed = f"{nic.speed_gbps:g} Gb/s" if nic.speed_gbps is not None else "speed unknown"
        state = {True: "up", False: "down", None: "link state unknown"}[nic.link_up]
        found = f"{nic.name} ({choice.tier}; {state}, {speed})"
        expected = f"up, {fastest:g} Gb/s" if fastest else "up"
        if nic.link_up is False:
            why = (
                "its nearest NIC is down: this GPU's traffic leaves through a farther one; check cable and switch port"
            )
            results.append(CheckResult("nic_binding", "fail", subject, found, expected, why))
        elif nic.speed_gbps is not None and nic.speed_gbps < fastest:
            why = "its NIC trained below the others': every collective waits for this rank"
            results.append(CheckResult("nic_binding", "warn", subject, found, expected, why))
        elif choice.tier == TIERS[-1]:
            why = "its nearest NIC is on another NUMA node: its RDMA crosses the CPU interconnect"
            results.append(CheckResult("nic_binding", "warn", subject, found, expected, why))
        else:
            results.append(CheckResult("nic_binding", "pass", subject, found, expected))
    return results
