"""The pre-flight's verdict, as ``preflight --json`` prints it and the run report holds it under
``preflight`` (docs/preflight.md): the tiers, the GEMMs, the node pairs and the exclude list.
Typed like the rest of the report (``codec.doc`` rows of docs/report-format.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc


@dataclass(frozen=True)
class PreflightTier:
    name: str = field(metadata=doc("`nvlink:0,1` (host GPU indexes) or `node`"))
    kind: str = field(metadata=doc("the tier's kind (docs/preflight.md)"))
    ranks: tuple[int, ...] = field(metadata=doc("the global ranks taking part"))
    gpus: tuple[int, ...] = field(metadata=doc("their host GPU indexes"))
    size_bytes: int = field(metadata=doc("bytes per all-reduce"))
    iters: int = field(metadata=doc("timed all-reduces"))
    seconds: float | None = field(metadata=doc("per all-reduce, the slowest member's; null: not measured"))
    algbw_gbps: float | None = field(metadata=doc("size / time, GB/s"))
    busbw_gbps: float | None = field(metadata=doc("bus bandwidth (nccl-tests' `busbw`), GB/s"))
    expected_busbw_gbps: float | None = field(metadata=doc("the floor it is judged against; null: none"))
    expected_source: str = field(metadata=doc("how the floor was derived"))
    correct: bool | None = field(metadata=doc("the sums came back right on every member"))
    status: str = field(metadata=doc("`pass`, `warn`, `fail` or `info`"))
    message: str = field(metadata=doc("why, for warn and fail"))


@dataclass(frozen=True)
class NetworkExpectation:
    port: str = field(metadata=doc("InfiniBand `device/port`"))
    rate: str | None = field(metadata=doc("its sysfs rate, e.g. `400 Gb/sec (4X NDR)`"))
    expected_busbw_gbps: float = field(metadata=doc("rate / 8 x 0.8"))
    measured: bool = field(metadata=doc("false: reported only (node pairs are judged against each other)"))


@dataclass(frozen=True)
class PreflightGemm:
    node: str = field(metadata=doc("the node of the rank that ran it"))
    rank: int = field(metadata=doc("its global rank"))
    local_rank: int = field(metadata=doc("its local rank"))
    gpu: int | None = field(metadata=doc("host GPU index; null: a CPU rank (float32 on its CPU set)"))
    gpu_uuid: str | None = field(metadata=doc("the GPU's UUID; null: a CPU rank"))
    device: str = field(
        metadata=doc("the GPU's name, or `cpu xN threads`: GEMMs are compared with those of the same device")
    )
    dtype: str = field(metadata=doc("`bfloat16` (GPU) or `float32` (CPU)"))
    n: int = field(metadata=doc("matrix side: n x n times n x n"))
    tflops: float = field(metadata=doc("the best repetition's 2 n^3 / time, in 1e12 floating-point operations/s"))
    node_median_tflops: float = field(metadata=doc("the median over its node's ranks of the same device"))
    job_median_tflops: float = field(metadata=doc("the median of the job's node medians, same device"))
    expected_tflops: float | None = field(metadata=doc("`--expect`: the recorded TFLOPS x 0.8; null: none"))
    status: str = field(metadata=doc("`pass` or `slow`"))
    message: str = field(metadata=doc("why, for slow"))


@dataclass(frozen=True)
class PreflightPair:
    name: str = field(metadata=doc("`pair:A,B`: the two nodes, in node-rank order"))
    nodes: tuple[str, ...] = field(metadata=doc("the two node names"))
    round: int = field(metadata=doc("the round it ran in (0-based); pairs of one round run at once"))
    ranks: tuple[int, ...] = field(metadata=doc("every rank of both nodes"))
    size_bytes: int = field(metadata=doc("bytes per all-reduce"))
    iters: int = field(metadata=doc("timed all-reduces"))
    seconds: float | None = field(metadata=doc("the median all-reduce of the slowest member; null: not measured"))
    busbw_gbps: float | None = field(metadata=doc("bus bandwidth (nccl-tests' `busbw`), GB/s"))
    reference_busbw_gbps: float | None = field(
        metadata=doc("the median over the nodes of each node's best pair, GB/s: what it is compared with")
    )
    expected_busbw_gbps: float | None = field(metadata=doc("`--expect`: the recorded busbw x 0.8; null: none"))
    correct: bool | None = field(metadata=doc("the sums came back right on every member"))
    status: str = field(metadata=doc("`pass`, `slow` or `fail` (wrong sums, no result)"))
    message: str = field(metadata=doc("why, for slow and fail"))


@dataclass(frozen=True)
class PreflightExclusion:
    node: str = field(metadata=doc("the config's node name"))
    host: str = field(metadata=doc("the name in the exclude list (the node name; with no config, the host name)"))
    reasons: tuple[str, ...] = field(metadata=doc("each measurement that named it"))


@dataclass(frozen=True)
class PreflightDecision:
    slow_pct: float = field(metadata=doc("a GPU or pair this many % below its reference is slow (`--slow-pct`)"))
    nodes: tuple[str, ...] = field(metadata=doc("the nodes measured, in node-rank order"))
    rounds: int = field(metadata=doc("rounds of node pairs (N - 1 for even N, N for odd N nodes)"))
    gemm: tuple[PreflightGemm, ...] = field(metadata=doc("one per GPU (per CPU rank), job-wide"))
    pairs: tuple[PreflightPair, ...] = field(metadata=doc("one per node pair (none on one node)"))
    excluded: tuple[PreflightExclusion, ...] = field(metadata=doc("the nodes to leave out, and why"))
    exclude_hostlist: str = field(metadata=doc("them as one Slurm hostlist (`node[01-03,07]`), for `sbatch --exclude`"))
    unexplained: tuple[str, ...] = field(
        metadata=doc("slow or failed pairs that no excluded node explains (two nodes: either end; the fabric)")
    )


@dataclass(frozen=True)
class PreflightVerdict:
    """What ``preflight --json`` prints (docs/preflight.md)."""

    schema: str = field(metadata=doc("`openclaw-preflight/1`"))
    node: str = field(metadata=doc("the node probed"))
    backend: str = field(metadata=doc("`nccl` or `gloo`"))
    scope: str = field(
        metadata=doc("`node` (one node) or `job` (several: GEMMs compared and node pairs measured across them)")
    )
    size_bytes: int = field(metadata=doc("bytes per all-reduce"))
    iters: int = field(metadata=doc("timed all-reduces per tier"))
    tiers: tuple[PreflightTier, ...] = field(metadata=doc("one per tier (see `preflight.tiers[]`)"))
    network: tuple[NetworkExpectation, ...] = field(
        metadata=doc("each active InfiniBand port's expectation, reported only (see `preflight.network[]`)")
    )
    decision: PreflightDecision | None = field(
        metadata=doc(
            "the GEMM and node-pair tests and the exclude list (see `preflight.decision`); null: not measured", since=5
        ),
    )
    workers_exit_code: int = field(metadata=doc("the launcher's exit code for the probe's workers"))
    exit_code: int = field(metadata=doc("preflight's exit code (docs/preflight.md)"))
