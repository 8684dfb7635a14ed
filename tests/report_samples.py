"""Typed run reports with every part filled (statistics, stragglers, hang, preflight, history), for
the report tests: the codec, the docs tables, the merge, the fuzzed loader."""

from __future__ import annotations

from openclaw_launch.report.membership import Exclusion
from openclaw_launch.report.model import SCHEMA, AttemptEntry, NodeReport
from openclaw_launch.report.preflight import (
    NetworkExpectation,
    PreflightDecision,
    PreflightGemm,
    PreflightTier,
    PreflightVerdict,
)
from openclaw_launch.report.rank import RankEntry, RankOutcome, SectionTimes, StepStatistics, StepTimes
from openclaw_launch.stats.result import DroppedDatagrams, GpuStats, Hang, HangRank, RunStatistics, Straggler


def outcome(rank: int, node: str, attempt: int = 0, exit_code: int | None = 0) -> RankOutcome:
    return RankOutcome(
        rank=rank,
        local_rank=rank % 2,
        node=node,
        attempt=attempt,
        pid=1000 + rank,
        exit_code=exit_code,
        signal=None,
        wall_s=3.0,
        cpu_s=2.5,
        max_rss_kib=300_000,
        bound_cpus=str(rank),
        bound_mems="0",
        binding_warning=None,
    )


def step_statistics(input_ms: float = 1.0, work_ms: float = 8.0, wait_ms: float = 1.0) -> StepStatistics:
    step = (input_ms + work_ms + wait_ms) / 1000
    sections = {"input": input_ms, "compute": work_ms, "sync": wait_ms}
    return StepStatistics(
        steps=40,
        measured_steps=37,
        step_source="api",
        step_time_s=StepTimes(p50=step, p90=step * 1.2, p99=step * 1.5, max=step * 1.6, mean=step),
        sections={
            name: SectionTimes(p50=ms / 1000, p90=ms / 800, mean=ms / 1000, share=ms / 1000 / step)
            for name, ms in sections.items()
        },
        sync_sections=("sync",),
        input_wait_share=input_ms / 1000 / step,
        wait_share=wait_ms / 1000 / step,
        wait_s=wait_ms / 1000,
        sync_sections_s=wait_ms / 1000,
        gpu_collective_s=None,
        gpu_longest_collective_s=None,
        busy_s=(input_ms + work_ms) / 1000,
        dropped_batches=0,
    )


def rank_entry(rank: int, node: str, statistics: StepStatistics | None = None) -> RankEntry:
    return RankEntry(
        **vars(outcome(rank, node)),
        gpu_uuid=f"GPU-{rank}",
        pci_bus_id=f"0000:0{rank}:00.0",
        numa_node=0,
        planned_cpus=str(rank),
        statistics=statistics,
        gpu=GpuStats(
            samples=3,
            util_pct_mean=90.0,
            sm_clock_mhz_mean=1980.0,
            sm_clock_mhz_min=1900.0,
            power_w_mean=500.0,
            temp_c_max=60.0,
            memory_used_mib_max=1024.0,
            clock_event_reasons=("sw_power_cap",),
            pcie_rx_mbps_mean=None,
            pcie_tx_mbps_mean=None,
            sm_activity_pct_mean=None,
            tensor_activity_pct_mean=None,
        ),
    )


HANG = Hang(
    timeout_s=3.0,
    exit_code=124,
    all_silent=False,
    stack_source="faulthandler",
    ranks=(
        HangRank(
            rank=1,
            local_rank=1,
            node="n0",
            pid=1001,
            stuck=True,
            steps=4,
            no_step_s=3.2,
            phase="compute",
            in_phase_s=3.1,
            collective=None,
            stack=("Current thread 0x1 (most recent call first):", '  File "train.py", line 9 in step'),
        ),
    ),
)
STRAGGLER = Straggler(
    rank=1,
    node="n0",
    phase="input",
    section="input",
    excess_s=0.01,
    excess_pct=50.0,
    busy_s=0.02,
    peers_busy_s=0.01,
    peers_wait_s=0.01,
    wait_source="cpu-phases",
    hints=("input pipeline: 60 % of its step waiting for data",),
)
PREFLIGHT = PreflightVerdict(
    schema="openclaw-preflight/1",
    node="n0",
    backend="gloo",
    scope="node",
    size_bytes=1 << 20,
    iters=5,
    tiers=(
        PreflightTier(
            name="node",
            kind="node",
            ranks=(0, 1),
            gpus=(),
            size_bytes=1 << 20,
            iters=5,
            seconds=0.001,
            algbw_gbps=1.05,
            busbw_gbps=1.05,
            expected_busbw_gbps=None,
            expected_source="no expectation",
            correct=True,
            status="info",
            message="",
        ),
    ),
    network=(
        NetworkExpectation(port="mlx5_0/1", rate="400 Gb/sec (4X NDR)", expected_busbw_gbps=40.0, measured=False),
    ),
    decision=PreflightDecision(
        slow_pct=50.0,
        nodes=("n0",),
        rounds=0,
        gemm=(
            PreflightGemm(
                node="n0",
                rank=0,
                local_rank=0,
                gpu=None,
                gpu_uuid=None,
                device="cpu",
                dtype="float32",
                n=256,
                tflops=0.1,
                node_median_tflops=0.1,
                job_median_tflops=0.1,
                expected_tflops=None,
                status="pass",
                message="",
            ),
        ),
        pairs=(),
        excluded=(),
        exclude_hostlist="",
        unexplained=(),
    ),
    workers_exit_code=0,
    exit_code=0,
)


EXCLUSION = Exclusion("n1", "gpu-a07", "gpu-xid", "NVML: XID 79 on GPU-5e1c", 0, 1_765_000_000.5)


def node_report(node: str = "n0", rank_ids: tuple[int, ...] = (0, 1), **changes: object) -> NodeReport:
    """A failed-then-restarted node with statistics; ``changes`` replace fields."""
    fields: dict[str, object] = {
        "schema": SCHEMA,
        "run_id": "job1",
        "node": node,
        "world_size": 4,
        "master_port": 29500,
        "exit_code": 0,
        "attempts": 2,
        "signal_received": None,
        "root_cause": None,
        "attempt_history": (
            AttemptEntry(
                attempt=0,
                root_cause=outcome(rank_ids[0], node, 0, 7),
                ranks=tuple(outcome(r, node, 0, 7 if r == rank_ids[0] else None) for r in rank_ids),
            ),
            AttemptEntry(attempt=1, root_cause=None, ranks=tuple(outcome(r, node, 1) for r in rank_ids)),
        ),
        "log_errors": (),
        "console_dropped_lines": 0,
        "guardian_lost": None,
        "statistics": RunStatistics(
            threshold_pct=5.0,
            wait_source="cpu-phases",
            sync_bound_share=None,
            gpu_error=None,
            stats_file_error=None,
            bad_datagrams=3,
            dropped_datagrams={str(rank_ids[-1]): DroppedDatagrams(invalid=2, not_rank_process=1, over_rate=0)},
        ),
        "stragglers": (),
        "hang": None,
        "ranks": tuple(rank_entry(r, node, step_statistics()) for r in rank_ids),
        "unkillable_pids": (),
        "containment": "process-groups+subreaper+guardian",
        "preflight": None,
    }
    fields.update(changes)
    return NodeReport(**fields)  # type: ignore[arg-type]
