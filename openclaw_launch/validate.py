"""The topology validator: the config checked against the machine, one result per check.

Pure over its inputs (config, topology, node name, and a few injected facts such as
where numactl is and what the MPS daemon answered), so every check is testable with
constructed topologies. Besides "is this the machine the config describes", it looks
for the health signals that make one GPU a straggler: a down NVLink, a PCIe link
trained below its maximum, AER errors, retired pages, ECC errors, bad IB ports.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, Protocol

from openclaw_launch.binding import numactl_missing, uses_numactl
from openclaw_launch.config import Config, GpuSpec, NodeSpec, Runtime, Strictness
from openclaw_launch.topology.model import INACTIVE_NVLINK, GpuInfo, IbPort, PcieLink, Topology

Status = Literal["pass", "warn", "fail"]

VALIDATE_SCHEMA = 1

# Error counters under /sys/class/infiniband/<dev>/ports/<n>/counters and the count above
# which a port is reported. Counters accumulate from when they were last cleared, so a
# healthy link may show a few symbol/receive errors from link training; a link that went
# down or had to recover, or dropped packets for integrity, is worth a look at any count.
# Traffic counters (port_xmit_data, ...) are not errors and are never checked.
IB_ERROR_THRESHOLDS: Mapping[str, int] = {
    "symbol_error": 10,
    "port_rcv_errors": 10,
    "link_downed": 0,
    "link_error_recovery": 0,
    "local_link_integrity_errors": 0,
    "excessive_buffer_overrun_errors": 0,
    "port_rcv_remote_physical_errors": 0,
    "port_rcv_switch_relay_errors": 100,  # also counts harmless routing drops on switches
    "port_xmit_discards": 100,  # congestion side effect, not a link fault
    "port_xmit_constraint_errors": 0,
    "port_rcv_constraint_errors": 0,
    "VL15_dropped": 100,
}


# NVML NVLink error counters (summed over a GPU's links) and the count above which a GPU is
# reported. Flit CRC errors are corrected by replaying the flit, so a few per link are normal;
# a recovery means the link retrained, and data CRC errors mean corrupted payloads were retried.
NVLINK_ERROR_THRESHOLDS: Mapping[str, int] = {"replay": 100, "recovery": 0, "crc_flit": 100, "crc_data": 0}


@dataclass(frozen=True)
class Thresholds:
    """Counts above which a health counter is reported (all are totals since boot/clear).

    - ``aer_correctable`` (100): correctable PCIe errors are replayed by hardware; a few
      since boot are normal, hundreds mean a marginal link that keeps retrying.
      Non-fatal and fatal AER errors always fail.
    - ``retired_pages`` (0): any retired page means the GPU's memory has had repeated or
      uncorrectable errors; raise this on fleets that tolerate a few.
      Uncorrected ECC errors always fail.
    - ``ib_counters`` (``IB_ERROR_THRESHOLDS``): per InfiniBand error counter.
    - ``nvlink_errors`` (``NVLINK_ERROR_THRESHOLDS``): per NVLink error counter, summed over a GPU's links.
    """

    aer_correctable: int = 100
    retired_pages: int = 0
    ib_counters: Mapping[str, int] = field(default_factory=lambda: dict(IB_ERROR_THRESHOLDS))
    nvlink_errors: Mapping[str, int] = field(default_factory=lambda: dict(NVLINK_ERROR_THRESHOLDS))


class MpsStatusLike(Protocol):
    """What the validator needs from the MPS daemon's state (``mps.MpsStatus`` fits)."""

    @property
    def answering(self) -> bool:
        """The control daemon replied on its pipe directory."""
        ...

    @property
    def error(self) -> str | None:
        """Why it is not answering."""
        ...

    @property
    def client_count(self) -> int:
        """MPS clients connected to all its servers."""
        ...

    @property
    def clients_per_gpu(self) -> Mapping[str, int]:
        """GPU UUID -> clients, from the daemon's per-device list (empty when it gave none)."""
        ...


@dataclass(frozen=True)
class CheckResult:
    name: str  # stable identifier, e.g. "bus_id", "nvlink_active"
    status: Status
    subject: str  # what was checked: "GPU 0 GPU-584f...", "node0", "mlx5_0 port 1"
    found: str
    expected: str  # the configured value or the threshold; "" when nothing is expected
    message: str = ""  # why it matters / what to do; one line

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def run_checks(
    config: Config,
    topology: Topology,
    node: str,
    numactl_path: str | None,
    mps: MpsStatusLike | None = None,
    thresholds: Thresholds | None = None,
    strictness: Strictness | None = None,
    mps_pipe_dir: str | None = None,
) -> list[CheckResult]:
    """Every check for ``node`` of ``config`` against ``topology``, node checks first.

    ``mps`` is what the host's own (system) MPS daemon on ``mps_pipe_dir`` answered: the private
    daemon ``run`` starts for the job does not exist yet, and the results say which one was checked.

    ``strictness`` overrides ``runtime.strictness`` for bus-id / NUMA / NVLink-peer mismatches.
    Raises PlanError (via ``Config.node``) when ``node`` is not in the config.
    """
    spec = config.node(node)
    rt = config.runtime
    th = thresholds or Thresholds()
    mismatch: Status = strictness or rt.strictness
    results = [_check_numactl(spec, rt, numactl_path)]
    if spec.is_cpu:
        results.append(_check_cpu_workers(spec, topology))
    elif rt.enable_mps:
        results += _mps_node_checks(spec, rt, mps, mps_pipe_dir)
    for gpu_spec in spec.gpus:
        results += _gpu_checks(gpu_spec, topology, rt, th, mismatch, mps)
    results += _check_unconfigured(spec, topology)
    fastest = max((p.rate_gbps or 0.0 for p in topology.infiniband if _active(p)), default=0.0)
    seen_devices: set[str] = set()
    for port in topology.infiniband:
        results += _ib_checks(port, th)
        results += _ib_rate(port, fastest)
        if port.device not in seen_devices:  # PCI facts belong to the NIC, not to each port
            seen_devices.add(port.device)
            results += _nic_checks(port, spec, topology, th)
    return results


def summarize(results: Sequence[CheckResult]) -> tuple[int, int, int]:
    """(passed, warnings, failed)."""

    def count(status: Status) -> int:
        return sum(r.status == status for r in results)

    return count("pass"), count("warn"), count("fail")


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 only when no check failed; warnings do not change the exit code."""
    return 1 if any(r.status == "fail" for r in results) else 0


def format_results(results: Sequence[CheckResult]) -> str:
    """One line per check (``PASS  subject  name: found (expected ...) - message``) and a summary."""
    width = max((len(r.subject) for r in results), default=0)
    lines = [_format_line(r, width) for r in results]
    n_pass, n_warn, n_fail = summarize(results)
    lines.append(f"{n_pass} passed, {n_warn} warnings, {n_fail} failed")
    return "\n".join(lines)


def results_to_json(results: Sequence[CheckResult]) -> dict[str, object]:
    """``{"schema": 1, "checks": [...], "summary": {"passed", "warnings", "failed"}}``."""
    n_pass, n_warn, n_fail = summarize(results)
    return {
        "schema": VALIDATE_SCHEMA,
        "checks": [r.to_json() for r in results],
        "summary": {"passed": n_pass, "warnings": n_warn, "failed": n_fail},
    }


def _format_line(r: CheckResult, width: int) -> str:
    line = f"{r.status.upper()}  {r.subject:<{width}}  {r.name}: {r.found}"
    if r.expected:
        line += f" (expected {r.expected})"
    if r.message:
        line += f" - {r.message}"
    return line


# --- node checks -------------------------------------------------------------


def _check_numactl(spec: NodeSpec, rt: Runtime, numactl_path: str | None) -> CheckResult:
    """What ``run`` would do here: numactl is used for every binding but ``none`` (the plan's rule)."""
    needed = uses_numactl(rt.binding)
    expected = "installed" if needed else f"not needed (binding {rt.binding})"
    if numactl_path:
        return CheckResult("numactl", "pass", spec.name, numactl_path, expected)
    missing = numactl_missing(rt.binding, numactl_path)
    if missing:
        return CheckResult("numactl", "warn", spec.name, "not found", expected, missing)
    return CheckResult(
        "numactl", "pass", spec.name, "not found", expected, "workers start without numactl; mem_policy is not applied"
    )


def _check_cpu_workers(spec: NodeSpec, topology: Topology) -> CheckResult:
    workers = spec.cpu_workers or 0
    expected = f">= {workers} CPUs"
    allowed = len(topology.allowed_cpus)
    if not allowed:
        return CheckResult("cpu_workers", "warn", spec.name, "not available", expected, "allowed CPUs unknown")
    found = f"{allowed} allowed CPUs"
    if allowed < workers:
        return CheckResult(
            "cpu_workers",
            "warn",
            spec.name,
            found,
            expected,
            f"{workers} workers will share {allowed} CPUs and slow each other down",
        )
    return CheckResult("cpu_workers", "pass", spec.name, found, expected)


_SYSTEM_DAEMON = "the host's MPS daemon, not the private one `run` starts for this job"


def _mps_node_checks(spec: NodeSpec, rt: Runtime, mps: MpsStatusLike | None, pipe_dir: str | None) -> list[CheckResult]:
    """The system daemon answers, and its clients fit in ``mps_max_clients_per_gpu`` on every GPU together.

    ``run`` starts a private daemon of its own (in its run directory) when the job starts; what can be
    checked before is the host's daemon, whose clients share these GPUs with the job."""
    which = f"system daemon ({pipe_dir})" if pipe_dir else "system daemon"
    if mps is None:
        return [CheckResult("mps_daemon", "warn", spec.name, "not available", "answering", "MPS state unknown")]
    if not mps.answering:
        why = f"{mps.error}; " if mps.error else ""
        return [
            CheckResult(
                "mps_daemon",
                "warn",
                spec.name,
                f"{which} not answering",
                "answering",
                f"{why}checked {_SYSTEM_DAEMON}: that one is started with the job",
            )
        ]
    results = [
        CheckResult("mps_daemon", "pass", spec.name, f"{which} answering", "answering", f"checked {_SYSTEM_DAEMON}")
    ]
    if rt.mps_max_clients_per_gpu is not None:
        limit = rt.mps_max_clients_per_gpu * len(spec.gpus)
        status: Status = "fail" if mps.client_count > limit else "pass"
        why = f"more clients of {_SYSTEM_DAEMON} than the node's GPUs allow: another job shares them"
        found = f"{mps.client_count} clients"
        results.append(
            CheckResult("mps_clients_total", status, spec.name, found, f"<= {limit}", why if status == "fail" else "")
        )
    return results


def _check_unconfigured(spec: NodeSpec, topology: Topology) -> list[CheckResult]:
    """GPUs on the host the config does not use: forgotten in the config, or someone else's."""
    if not topology.gpus:
        return []
    configured = {g.uuid.lower() for g in spec.gpus}
    unused = [g for g in topology.gpus if (g.uuid or "").lower() not in configured]
    if not unused:
        n = len(topology.gpus)
        return [CheckResult("unconfigured_gpus", "pass", spec.name, f"all {n} host GPUs configured", "")]
    return [
        CheckResult(
            "unconfigured_gpus",
            "warn",
            _host_subject(g),
            "present but not configured",
            "",
            f"GPU {g.index} present but not configured for {spec.name}; add it or leave it to another job",
        )
        for g in unused
    ]


# --- per-GPU checks ----------------------------------------------------------


def _host_subject(g: GpuInfo) -> str:
    return f"GPU {g.index} {g.uuid or '?'}"


def _gpu_checks(
    gpu_spec: GpuSpec,
    topology: Topology,
    rt: Runtime,
    th: Thresholds,
    mismatch: Status,
    mps: MpsStatusLike | None,
) -> list[CheckResult]:
    gpu = topology.gpu_by_uuid(gpu_spec.uuid)
    if gpu is None:
        return [_absent(gpu_spec, topology)]
    subject = _host_subject(gpu)
    results = [CheckResult("uuid_present", "pass", subject, f"bus {gpu.pci_bus_id or '?'}", "present")]
    maybe = [
        _check_bus_id(subject, gpu_spec, gpu, mismatch),
        _check_numa(subject, gpu_spec, gpu, mismatch),
        *(_check_peer(subject, gpu, peer, topology, mismatch) for peer in gpu_spec.nvlink_peers),
        _check_nvlinks_active(subject, gpu),
        _check_pcie(subject, gpu.pcie),
        _check_aer(subject, gpu.aer, th),
        _check_nvlink_errors(subject, gpu, th),
        _check_retired_pages(subject, gpu, th),
        _check_ecc(subject, gpu),
        _check_mps_clients(subject, _mps_clients(gpu, mps), rt) if rt.enable_mps else None,
    ]
    return results + [r for r in maybe if r is not None]


def _absent(gpu_spec: GpuSpec, topology: Topology) -> CheckResult:
    here = "; ".join(f"GPU {g.index} {g.uuid or '?'} bus {g.pci_bus_id or '?'}" for g in topology.gpus)
    return CheckResult(
        "uuid_present",
        "fail",
        f"GPU ? {gpu_spec.uuid}",
        "absent",
        "present",
        f"not on this host; GPUs here: {here or 'none'}. Fix the uuid (openclaw-launch discover lists them)",
    )


def _check_bus_id(subject: str, spec: GpuSpec, gpu: GpuInfo, mismatch: Status) -> CheckResult | None:
    if spec.pci_bus_id is None:
        return None
    expected = spec.pci_bus_id.lower()
    if gpu.pci_bus_id is None:
        return CheckResult("bus_id", "warn", subject, "not available", expected, "host did not report a bus id")
    if gpu.pci_bus_id.lower() == expected:
        return CheckResult("bus_id", "pass", subject, gpu.pci_bus_id, expected)
    return CheckResult(
        "bus_id",
        mismatch,
        subject,
        gpu.pci_bus_id,
        expected,
        "GPU moved slot or config is stale; update pci_bus_id",
    )


def _check_numa(subject: str, spec: GpuSpec, gpu: GpuInfo, mismatch: Status) -> CheckResult | None:
    if spec.numa_node is None:
        return None
    expected = str(spec.numa_node)
    if gpu.numa_node is None:
        return CheckResult(
            "numa_node",
            "warn",
            subject,
            "not available",
            expected,
            "host reports no NUMA information (sysfs numa_node -1); the configured node cannot be confirmed",
        )
    if gpu.numa_node == spec.numa_node:
        return CheckResult("numa_node", "pass", subject, str(gpu.numa_node), expected)
    return CheckResult(
        "numa_node",
        mismatch,
        subject,
        str(gpu.numa_node),
        expected,
        "workers would be bound to the wrong socket and cross the CPU interconnect; update numa_node",
    )


def _check_peer(subject: str, gpu: GpuInfo, peer_uuid: str, topology: Topology, mismatch: Status) -> CheckResult:
    expected = f"NVLink to {peer_uuid}"
    peer = topology.gpu_by_uuid(peer_uuid)
    if peer is None:
        return CheckResult("nvlink_peer", mismatch, subject, "peer not on this host", expected)
    kind = topology.link_between(gpu, peer)  # the rule plan uses too
    found = f"{kind or 'unknown'} to GPU {peer.index}"
    if kind is None:
        return CheckResult("nvlink_peer", "warn", subject, found, expected, "link type not available")
    if topology.nvlinked(gpu, peer):
        return CheckResult("nvlink_peer", "pass", subject, found, expected)
    why = "its NVLinks to this peer are down: reset the GPU or drain the node" if kind == INACTIVE_NVLINK else ""
    return CheckResult(
        "nvlink_peer",
        mismatch,
        subject,
        found,
        expected,
        f"traffic to this peer goes over PCIe; {why or 'check nvlink_peers'}",
    )


def _check_nvlinks_active(subject: str, gpu: GpuInfo) -> CheckResult | None:
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


def _check_pcie(subject: str, p: PcieLink | None) -> CheckResult | None:
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


def _check_aer(subject: str, aer: Mapping[str, int] | None, th: Thresholds) -> CheckResult | None:
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


def _check_nvlink_errors(subject: str, gpu: GpuInfo, th: Thresholds) -> CheckResult | None:
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


def _check_retired_pages(subject: str, gpu: GpuInfo, th: Thresholds) -> CheckResult | None:
    if gpu.retired_pages is None:
        return None
    expected = f"<= {th.retired_pages}"
    found = str(gpu.retired_pages)
    if gpu.retired_pages > th.retired_pages:
        return CheckResult("retired_pages", "warn", subject, found, expected, "GPU memory is degrading")
    return CheckResult("retired_pages", "pass", subject, found, expected)


def _check_ecc(subject: str, gpu: GpuInfo) -> CheckResult | None:
    if gpu.ecc_uncorrected is None:
        return None
    found = str(gpu.ecc_uncorrected)
    if gpu.ecc_uncorrected > 0:
        return CheckResult(
            "ecc_uncorrected",
            "fail",
            subject,
            found,
            "0",
            "uncorrected ECC errors crash jobs; drain this GPU",
        )
    return CheckResult("ecc_uncorrected", "pass", subject, found, "0")


def _mps_clients(gpu: GpuInfo, mps: MpsStatusLike | None) -> int | None:
    """Clients on ``gpu``: the answering daemon's per-device list, else what the topology recorded."""
    if mps is not None and mps.answering and gpu.uuid is not None:
        counts = {uuid.lower(): n for uuid, n in mps.clients_per_gpu.items()}
        if gpu.uuid.lower() in counts:
            return counts[gpu.uuid.lower()]
    return gpu.mps_clients


def _check_mps_clients(subject: str, count: int | None, rt: Runtime) -> CheckResult | None:
    if count is None:
        return None
    limit = rt.mps_max_clients_per_gpu
    if limit is None:
        return CheckResult("mps_clients", "pass", subject, str(count), "no limit configured")
    if count > limit:
        return CheckResult(
            "mps_clients",
            "fail",
            subject,
            str(count),
            f"<= {limit}",
            "more MPS clients than runtime.mps_max_clients_per_gpu: another job shares this GPU",
        )
    return CheckResult("mps_clients", "pass", subject, str(count), f"<= {limit}")


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
    maybe = [_check_pcie(subject, port.pcie), _check_aer(subject, port.aer, th), _check_nic_numa(port, spec, topology)]
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
