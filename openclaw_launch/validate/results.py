"""What every validator check returns, the thresholds the health checks compare against, and the
output (lines, JSON, exit code).

Shared by ``validate/host.py`` (the entry, node checks), ``validate/gpus.py`` (each configured GPU)
and ``validate/fabric.py`` (PCIe/AER, NVLink, InfiniBand, NIC).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Status = Literal["pass", "warn", "fail"]
VALIDATE_SCHEMA = 1  # of ``validate --json``

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


@dataclass(frozen=True)
class ValidateSummary:
    passed: int
    warnings: int
    failed: int


@dataclass(frozen=True)
class ValidateReport:
    """``validate --json``'s checks (through ``codec.to_json``; the command adds the fingerprint)."""

    schema: int  # VALIDATE_SCHEMA
    checks: tuple[CheckResult, ...]
    summary: ValidateSummary


def validate_report(results: Sequence[CheckResult]) -> ValidateReport:
    """The checks with their counts, as ``validate --json`` prints them."""
    return ValidateReport(VALIDATE_SCHEMA, tuple(results), ValidateSummary(*summarize(results)))


def _format_line(r: CheckResult, width: int) -> str:
    line = f"{r.status.upper()}  {r.subject:<{width}}  {r.name}: {r.found}"
    if r.expected:
        line += f" (expected {r.expected})"
    if r.message:
        line += f" - {r.message}"
    return line
