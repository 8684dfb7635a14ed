"""The validator's fabric and link-health checks: PCIe link training and AER (GPUs and NICs), NVLink
state and error counters, InfiniBand port state/rate/error counters, and each NIC's NUMA placement."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from openclaw_launch.config.model import NodeSpec
from openclaw_launch.topology.model import GpuInfo, IbPort, PcieLink, Topology
from openclaw_launch.validate.results import CheckResult, Thresholds


def fabric_checks(spec: NodeSpec, topology: Topology, th: Thresholds) -> list[CheckResult]:
    """Every InfiniBand port's state, rate and error counters, and each NIC's PCIe link, AER and NUMA node."""
    results: list[CheckResult] = []
    fastest = max((p.rate_gbps or 0.0 for p in topology.infiniband if _active(p)), default=0.0)
    seen_devices: set[str] = set()
    for port in topology.infiniband:
        results += _ib_checks(port, th)
        results += _ib_rate(port, fastest)
        if port.device not in seen_devices:  # PCI facts belong to the NIC, not to each port
            seen_devices.add(port.device)
            results += _nic_checks(port, spec, topology, th)
    return results


# --- links of a GPU or NIC ---------------------------------------------------


def check_nvlinks_active(subject: str, gpu: GpuInfo) -> CheckResult | None:
    if not gpu.nvlinks:
        return None
    down = [link.link for link in gpu.nvlinks if not link.active]
    total = len(gpu.nvlinks)
    found = f"{total - len(down)}/{total} active"
    if not down:
        return CheckResult("nvlink_active", "pass", subject, found, "all active")
    return CheckResult(
        "nvlink_active",
        "fail",
        subject,
        f"{found} (down: {', '.join(map(str, down))})",
        "all active",
        "a down NVLink makes this GPU a straggler; reset the GPU or drain the node",
    )


def check_pcie(subject: str, p: PcieLink | None) -> CheckResult | None:
    """GPU or NIC link trained below its maximum generation or width."""
    if p is None:
        return None
    gen_low = p.gen is not None and p.max_gen is not None and p.gen < p.max_gen
    width_low = p.width is not None and p.max_width is not None and p.width < p.max_width
    found = f"gen{p.gen or '?'} x{p.width or '?'}"
    expected = f"gen{p.max_gen or '?'} x{p.max_width or '?'}"
    if not (gen_low or width_low):
        return CheckResult("pcie_link", "pass", subject, found, expected)
    why = "link trained below its maximum: host-device copies are slower"
    if gen_low and not width_low:
        why += "; idle GPUs lower their PCIe gen to save power, so re-check under load"
    return CheckResult("pcie_link", "warn", subject, found, expected, why)


def check_aer(subject: str, aer: Mapping[str, int] | None, th: Thresholds) -> CheckResult | None:
    """PCIe AER totals of a GPU or NIC."""
    if aer is None:
        return None
    corr, nonfatal, fatal = (aer.get(k) for k in ("correctable", "nonfatal", "fatal"))
    found = f"correctable {_n(corr)}, nonfatal {_n(nonfatal)}, fatal {_n(fatal)}"
    expected = f"correctable <= {th.aer_correctable}, nonfatal 0, fatal 0"
    if (nonfatal or 0) > 0 or (fatal or 0) > 0:
        return CheckResult(
            "pcie_aer",
            "fail",
            subject,
            found,
            expected,
            "uncorrectable PCIe errors; reseat or replace before use",
        )
    if (corr or 0) > th.aer_correctable:
        return CheckResult("pcie_aer", "warn", subject, found, expected, "marginal PCIe link keeps replaying")
    return CheckResult("pcie_aer", "pass", subject, found, expected)


def check_nvlink_errors(subject: str, gpu: GpuInfo, th: Thresholds) -> CheckResult | None:
    """NVML's per-link replay / recovery / CRC counters, summed over the GPU's links."""
    known = [link for link in gpu.nvlinks if link.errors is not None]
    if not known:
        return None
    totals = {name: sum((link.errors or {}).get(name, 0) for link in known) for name in th.nvlink_errors}
    expected = ", ".join(f"{k} <= {v}" for k, v in th.nvlink_errors.items())
    over = {k: v for k, v in totals.items() if v > th.nvlink_errors[k]}
    found = ", ".join(f"{k} {v}" for k, v in totals.items())
    if not over:
        return CheckResult("nvlink_errors", "pass", subject, found, expected)
    worst = [
        f"link {link.link}"
        for link in known
        if any((link.errors or {}).get(k, 0) > th.nvlink_errors[k] / max(1, len(known)) for k in over)
    ]
    return CheckResult(
        "nvlink_errors",
        "warn",
        subject,
        found + (f" (mostly {', '.join(worst[:4])})" if worst else ""),
        expected,
        "NVLink retransmits or retrains: bandwidth drops and a worse link goes down; check with a preflight",
    )


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


# --- InfiniBand --------------------------------------------------------------


def _ib_checks(port: IbPort, th: Thresholds) -> Iterator[CheckResult]:
    subject = f"{port.device} port {port.port}"
    if port.state is not None:
        active = "ACTIVE" in port.state.upper()
        yield CheckResult(
            "ib_port_state",
            "pass" if active else "warn",
            subject,
            port.state,
            "ACTIVE",
            "" if active else "port is not active; NCCL falls back to other ports or sockets",
        )
    checked = {k: v for k, v in port.counters.items() if k in th.ib_counters}
    if not checked:
        return
    over = {k: v for k, v in checked.items() if v > th.ib_counters[k]}
    shown = over or checked
    found = ", ".join(f"{k} {v}" for k, v in sorted(shown.items()))
    expected = ", ".join(f"{k} <= {th.ib_counters[k]}" for k in sorted(shown))
    if over:
        yield CheckResult(
            "ib_port_errors", "warn", subject, found, expected, "link errors slow every rank's collectives"
        )
    else:
        yield CheckResult("ib_port_errors", "pass", subject, f"{len(checked)} error counters within limits", "")


def _active(port: IbPort) -> bool:
    return port.state is not None and "ACTIVE" in port.state.upper()


def _ib_rate(port: IbPort, fastest: float) -> Iterator[CheckResult]:
    """An active port slower than the host's fastest one trained down (cable, optics, switch port)."""
    rate = port.rate_gbps
    if rate is None or not _active(port):
        return
    subject = f"{port.device} port {port.port}"
    expected = f"{fastest:g} Gb/s (the fastest port here)"
    if rate < fastest:
        yield CheckResult(
            "ib_port_rate",
            "warn",
            subject,
            port.rate or "",
            expected,
            "port trained below the others: every collective through it is slower; check cable and switch port",
        )
    else:
        yield CheckResult("ib_port_rate", "pass", subject, port.rate or "", expected)


def _nic_checks(port: IbPort, spec: NodeSpec, topology: Topology, th: Thresholds) -> list[CheckResult]:
    """The NIC's PCIe link and AER (as for GPUs), and whether it sits on a NUMA node of a GPU it serves."""
    subject = port.device
    maybe = [check_pcie(subject, port.pcie), check_aer(subject, port.aer, th), _check_nic_numa(port, spec, topology)]
    return [r for r in maybe if r is not None]


def _check_nic_numa(port: IbPort, spec: NodeSpec, topology: Topology) -> CheckResult | None:
    if port.numa_node is None or spec.is_cpu:
        return None
    gpu_nodes = sorted(
        {g.numa_node for s in spec.gpus if (g := topology.gpu_by_uuid(s.uuid)) is not None and g.numa_node is not None}
    )
    if not gpu_nodes:
        return None
    expected = f"one of the GPUs' NUMA nodes ({', '.join(map(str, gpu_nodes))})"
    if port.numa_node in gpu_nodes:
        return CheckResult("nic_numa", "pass", port.device, f"NUMA node {port.numa_node}", expected)
    return CheckResult(
        "nic_numa",
        "warn",
        port.device,
        f"NUMA node {port.numa_node}",
        expected,
        "no configured GPU shares this NIC's NUMA node: GPUDirect RDMA through it crosses the CPU interconnect",
    )
