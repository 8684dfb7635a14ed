"""The topology validator: the config checked against the machine, one result per check.

Pure over its inputs (config, topology, node name, and a few injected facts such as
where numactl is and what the MPS daemon answered), so every check is testable with
constructed topologies. Besides "is this the machine the config describes", it looks
for the health signals that make one GPU a straggler: a down NVLink, a PCIe link
trained below its maximum, AER errors, retired pages, ECC errors, bad IB ports.

Here: the entry and the node checks. Per GPU: ``validate/gpus.py``; PCIe/AER, NVLink, IB, NIC:
``validate/fabric.py``; each GPU's nearest NIC (``runtime.nic_binding``): ``validate/nics.py``; the
result type, thresholds and output formats: ``validate/results.py``; this node's fingerprint:
``validate/fingerprint.py``.
"""

from __future__ import annotations

from collections.abc import Mapping

from openclaw_launch.config.model import Config, NodeSpec, Runtime, Strictness
from openclaw_launch.plan.binding import numactl_missing, uses_numactl
from openclaw_launch.topology.model import Topology
from openclaw_launch.validate.fabric import fabric_checks
from openclaw_launch.validate.gpus import check_unconfigured, gpu_checks
from openclaw_launch.validate.nics import nic_binding_checks
from openclaw_launch.validate.results import CheckResult, MpsStatusLike, Status, Thresholds


def run_checks(
    config: Config,
    topology: Topology,
    node: str,
    numactl_path: str | None,
    mps: MpsStatusLike | None = None,
    thresholds: Thresholds | None = None,
    strictness: Strictness | None = None,
    mps_pipe_dir: str | None = None,
    gpu_memory_mib: Mapping[str, float] | None = None,
) -> list[CheckResult]:
    """Every check for ``node`` of ``config`` against ``topology``, node checks first.

    ``mps`` is what the host's own (system) MPS daemon on ``mps_pipe_dir`` answered: the private
    daemon ``run`` starts for the job does not exist yet, and the results say which one was checked.

    ``strictness`` overrides ``runtime.strictness`` for bus-id / NUMA / NVLink-peer mismatches.
    ``gpu_memory_mib``: each GPU's used memory now, by UUID (run/gpu_memory.py's reading; none: unread).
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
        used = {u.lower(): mib for u, mib in (gpu_memory_mib or {}).items()}.get(gpu_spec.uuid.lower())
        results += gpu_checks(gpu_spec, topology, rt, th, mismatch, mps, used)
    results += check_unconfigured(spec, topology)
    results += fabric_checks(spec, topology, th)
    results += nic_binding_checks(spec, rt, topology)
    return results


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
