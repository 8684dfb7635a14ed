"""The per-GPU checks of the validator: identity (UUID; bus id, NUMA node and NVLink peers by the rules
``plan`` uses, ``config/checks.py``), the GPU's health (links via ``validate/fabric.py``; retired pages,
ECC), MPS clients, and host GPUs not configured."""

from __future__ import annotations

from openclaw_launch.config.checks import GpuCheck, identity_checks
from openclaw_launch.config.defaults import GPU_MEMORY_SLACK_MIB
from openclaw_launch.config.model import GpuSpec, NodeSpec, Runtime
from openclaw_launch.topology.model import GpuInfo, Topology
from openclaw_launch.validate.fabric import check_aer, check_nvlink_errors, check_nvlinks_active, check_pcie
from openclaw_launch.validate.results import CheckResult, MpsStatusLike, Status, Thresholds


def check_unconfigured(spec: NodeSpec, topology: Topology) -> list[CheckResult]:
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


def _host_subject(g: GpuInfo) -> str:
    return f"GPU {g.index} {g.uuid or '?'}"


def gpu_checks(
    gpu_spec: GpuSpec,
    topology: Topology,
    rt: Runtime,
    th: Thresholds,
    mismatch: Status,
    mps: MpsStatusLike | None,
    memory_used_mib: float | None = None,
) -> list[CheckResult]:
    """``memory_used_mib``: NVML's used memory of the GPU now (None: not read)."""
    gpu = topology.gpu_by_uuid(gpu_spec.uuid)
    if gpu is None:
        return [_absent(gpu_spec, topology)]
    subject = _host_subject(gpu)
    results = [CheckResult("uuid_present", "pass", subject, f"bus {gpu.pci_bus_id or '?'}", "present")]
    maybe = [
        *(_identity(subject, check, mismatch) for check in identity_checks(gpu_spec, gpu, topology)),
        check_nvlinks_active(subject, gpu),
        check_pcie(subject, gpu.pcie),
        check_aer(subject, gpu.aer, th),
        check_nvlink_errors(subject, gpu, th),
        _check_retired_pages(subject, gpu, th),
        _check_ecc(subject, gpu),
        _check_mps_clients(subject, _mps_clients(gpu, mps), rt) if rt.enable_mps else None,
        _check_memory_used(subject, memory_used_mib) if memory_used_mib is not None else None,
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


def _identity(subject: str, check: GpuCheck, mismatch: Status) -> CheckResult:
    """A shared rule's outcome (``config/checks.py``, which ``plan`` applies too) as a result line."""
    status: Status = {"match": "pass", "mismatch": mismatch, "unknown": "warn"}[check.outcome]
    message = check.advice if check.outcome == "mismatch" else "; ".join(filter(None, (check.problem, check.advice)))
    return CheckResult(check.name, status, subject, check.found, check.expected, message)


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


def _check_memory_used(subject: str, used_mib: float) -> CheckResult:
    """Memory held before any job: a leftover process (an elastic job after a failed attempt waits for
    each GPU to fall back to its level before the job, run/gpu_memory.py, and takes out a node whose
    GPU does not)."""
    found, expected = f"{used_mib:.0f} MiB used", f"<= {GPU_MEMORY_SLACK_MIB:g} MiB with no job"
    if used_mib <= GPU_MEMORY_SLACK_MIB:
        return CheckResult("gpu_memory_used", "pass", subject, found, expected)
    return CheckResult(
        "gpu_memory_used",
        "warn",
        subject,
        found,
        expected,
        "a process holds this GPU's memory (nvidia-smi --query-compute-apps=pid,used_memory): a job's leftover? "
        "An elastic job waits for this level after a failed attempt (--gpu-memory-timeout-s)",
    )


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
