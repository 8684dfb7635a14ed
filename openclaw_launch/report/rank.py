"""A rank in the report: how it ended, its resources and binding in force, its step statistics and
its GPU. Frozen; each field's ``doc`` is its row in docs/report-format.md (tools/report_docs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc
from openclaw_launch.stats.result import GpuStats


@dataclass(frozen=True)
class StepTimes:
    p50: float = field(metadata=doc("median step time (quantiles from log-spaced buckets, within 1 %)"))
    p90: float = field(metadata=doc("90th percentile"))
    p99: float = field(metadata=doc("99th percentile"))
    max: float = field(metadata=doc("the longest step"))
    mean: float = field(metadata=doc("mean step time"))


@dataclass(frozen=True)
class SectionTimes:
    p50: float = field(metadata=doc("median time per step in the phase"))
    p90: float = field(metadata=doc("90th percentile"))
    mean: float = field(metadata=doc("mean time per step"))
    share: float = field(metadata=doc("share of the mean step"))


@dataclass(frozen=True)
class StepStatistics:
    steps: int = field(metadata=doc("steps seen"))
    measured_steps: int = field(metadata=doc("steps in the distributions: the first 3 (warm-up) excluded"))
    step_source: str = field(metadata=doc("`api` (`telemetry.step()`) or `optimizer` (torch's optimizer step hook)"))
    step_time_s: StepTimes = field(metadata=doc("the step time's distribution (see `step_time_s`)"))
    sections: dict[str, SectionTimes] = field(
        metadata=doc(
            "per phase (see `sections`); phases are exclusive (nested time belongs to the innermost), "
            "`other` is step time no phase claimed"
        )
    )
    sync_sections: tuple[str, ...] = field(metadata=doc("the phases that contain waiting for other ranks"))
    input_wait_share: float = field(metadata=doc("share of the step in the input/host stage (`input` and `host`)"))
    wait_share: float = field(metadata=doc("`wait_s` as a share of the mean step"))
    wait_s: float = field(
        metadata=doc("time per step this rank waited for the others (its wait signal minus the least any rank shows)")
    )
    sync_sections_s: float = field(
        metadata=doc("time per step in `sync_sections` (absolute, includes the collectives' own cost)")
    )
    gpu_collective_s: float | None = field(
        metadata=doc("NCCL collective time per step from the flight recorder (`--telemetry full`, GPU ranks)")
    )
    gpu_longest_collective_s: float | None = field(
        metadata=doc(
            "the longest NCCL collective per step, averaged: how long this rank waited for the last one "
            "(the GPU wait signal)",
            since=3,
        )
    )
    busy_s: float = field(metadata=doc("mean step minus `wait_s`"))
    dropped_batches: int = field(metadata=doc("statistics batches the rank could not send (launcher busy)"))


@dataclass(frozen=True)
class RankOutcome:
    """The launcher's view of one rank in one attempt."""

    rank: int = field(metadata=doc("global rank"))
    local_rank: int = field(metadata=doc("rank on its node"))
    node: str = field(metadata=doc("its node"))
    attempt: int = field(metadata=doc("the attempt (0-based) it ran in"))
    pid: int | None = field(metadata=doc("its process; null when the spawn failed"))
    exit_code: int | None = field(metadata=doc("its exit code; null when a signal ended it or it was never reaped"))
    signal: str | None = field(metadata=doc("the signal that ended it (`SIGKILL`, ...)"))
    wall_s: float | None = field(metadata=doc("run time, measured on the monotonic clock"))
    cpu_s: float | None = field(metadata=doc("user + system CPU time"))
    max_rss_kib: int | None = field(metadata=doc("peak resident memory"))
    bound_cpus: str | None = field(metadata=doc("the CPUs it was really allowed (read back from `/proc`)"))
    bound_mems: str | None = field(metadata=doc("the memory nodes it was really allowed (read back from `/proc`)"))
    binding_warning: str | None = field(metadata=doc("the binding in force differs from the plan: how"))


@dataclass(frozen=True)
class RankEntry(RankOutcome):
    """A rank of the last attempt, with its plan, statistics and GPU."""

    gpu_uuid: str | None = field(metadata=doc("from the plan: its GPU; null for a CPU rank"))
    pci_bus_id: str | None = field(metadata=doc("from the plan: its GPU's PCI bus id"))
    numa_node: int | None = field(metadata=doc("from the plan: the NUMA node it is bound to"))
    planned_cpus: str | None = field(metadata=doc("from the plan: the CPUs it should run on"))
    statistics: StepStatistics | None = field(
        metadata=doc("its step statistics (see `ranks[].statistics`); null when it reported no step", since=2)
    )
    gpu: GpuStats | None = field(metadata=doc("its GPU's samples (see `ranks[].gpu`); null for a CPU rank", since=2))
    nic: str | None = field(
        default=None,
        metadata=doc(
            "from the plan: the NIC its NCCL was given (`NCCL_IB_HCA` / `NCCL_SOCKET_IFNAME`) under "
            "`runtime.nic_binding: nearest`; null otherwise",
            since=5,
        ),
    )
