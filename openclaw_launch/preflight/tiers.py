"""What a preflight measures and what it should find. Pure: plan + topology + settings -> tiers
with expected bus bandwidth, and measured times -> verdicts. No I/O, no torch.

Bandwidths are all-reduce *bus* bandwidth in GB/s (1e9 bytes/s), as nccl-tests reports it:
``busbw = size / time * 2 * (n - 1) / n``. It is comparable to one direction of a GPU's links,
which is why every expectation below is per direction.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from openclaw_launch.config.defaults import PREFLIGHT_SIZE_MIB
from openclaw_launch.config.model import PreflightSettings
from openclaw_launch.plan.model import LaunchPlan
from openclaw_launch.report.preflight import NetworkExpectation, PreflightTier
from openclaw_launch.topology.model import GpuInfo, Topology

Status = Literal["pass", "warn", "fail", "info"]
PREFLIGHT_SCHEMA = "openclaw-preflight/1"

#: NVLink bandwidth per link and direction, GB/s, by generation: NVLink 1 (P100) 20; 2, 3 and 4
#: (V100, A100, H100/H200) 25, which is why an H200 with 18 links is "900 GB/s" bidirectional;
#: 5 (B200) 50.
NVLINK_GBPS_PER_LINK: Mapping[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
#: GPU names -> NVLink generation, used before NVML's per-link version (known names are certain).
NVLINK_GEN_BY_NAME: tuple[tuple[str, int], ...] = (
    (r"\bGB?[23]00|\bB[12]00", 5),
    (r"\bGH200|\bH[12]00|\bH800|\bH20\b", 4),
    (r"\bA100|\bA800", 3),
    (r"\bV100", 2),
    (r"\bP100", 1),
)
#: PCIe bandwidth per lane and direction, GB/s, by generation (after line encoding).
PCIE_GBPS_PER_LANE: Mapping[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: Share of the link bandwidth an all-reduce reaches in practice (nccl-tests at 1 GiB): NVLink
#: 0.6 (2x H200 NV18 measured 324 GB/s = 0.72 of 450), PCIe 0.5 (through the root complex or
#: host memory), InfiniBand 0.8 (reported, not measured yet).
EFFICIENCY: Mapping[str, float] = {"nvlink": 0.6, "pcie": 0.5, "ib": 0.8}
#: A tier below this share of its expectation fails; between it and 1, it warns.
FAIL_BELOW = 0.5
#: ``--expect FILE``: a recorded bandwidth times this is the floor (runs vary by a few %).
RECORDED_MARGIN = 0.8
#: The most NVLinks one GPU has (H100/H200/B200): more NV# in a matrix row means NVSwitch.
MAX_NVLINKS_PER_GPU = 18
WARMUP_ITERS = 5


@dataclass(frozen=True)
class Tier:
    name: str  # "nvlink:0,1" (host GPU indexes) or "node"
    kind: str  # one of config.PREFLIGHT_TIER_KINDS
    ranks: tuple[int, ...]  # global ranks taking part (this node's)


@dataclass(frozen=True)
class Expectation:
    gbps: float | None  # the floor; None = nothing to compare with
    source: str  # how it was derived, for the output line


def nvlink_islands(plan: LaunchPlan, topology: Topology) -> list[tuple[GpuInfo, ...]]:
    """The plan's GPUs grouped by NVLink reachability (connected components), lowest index first."""
    gpus = _plan_gpus(plan, topology)
    islands: list[list[GpuInfo]] = []
    for g in gpus:
        joined = [isl for isl in islands if any(topology.nvlinked(g, o) for o in isl)]
        merged = [g] + [o for isl in joined for o in isl]
        islands = [isl for isl in islands if isl not in joined] + [merged]
    return sorted((tuple(sorted(isl, key=lambda x: x.index)) for isl in islands), key=lambda isl: isl[0].index)


def _plan_gpus(plan: LaunchPlan, topology: Topology) -> list[GpuInfo]:
    out: list[GpuInfo] = []
    for r in plan.ranks:
        g = topology.gpu_by_uuid(r.gpu_uuid) if r.gpu_uuid else None
        if g is not None and g not in out:
            out.append(g)
    return out


def plan_tiers(plan: LaunchPlan, topology: Topology) -> list[Tier]:
    """Each NVLink island of two or more GPUs, then the whole node (when it has two ranks or more).
    Only this node: across nodes, the node pairs measure (decide.py)."""
    tiers: list[Tier] = []
    for island in nvlink_islands(plan, topology):
        if len(island) < 2:
            continue
        uuids = {g.uuid for g in island}
        ranks = tuple(r.rank for r in plan.ranks if r.gpu_uuid in uuids)
        tiers.append(Tier("nvlink:" + ",".join(str(g.index) for g in island), "nvlink", ranks))
    if len(plan.ranks) >= 2:
        tiers.append(Tier("node", "node", tuple(r.rank for r in plan.ranks)))
    return tiers


def nvlink_generation(gpu: GpuInfo) -> int | None:
    """From the GPU's name when known, else NVML's per-link version (raw 1..5, or the 6/7 of
    NVML's version enum for 4.0/5.0)."""
    for pattern, gen in NVLINK_GEN_BY_NAME:
        if gpu.name and re.search(pattern, gpu.name):
            return gen
    versions = {link.version for link in gpu.nvlinks if link.version}
    if len(versions) == 1:
        v = versions.pop()
        return {6: 4, 7: 5}.get(v, v) if v in (1, 2, 3, 4, 5, 6, 7) else None
    return None


def _links_into(gpu: GpuInfo, island: Sequence[GpuInfo], topology: Topology) -> int | None:
    """Active NVLinks of ``gpu`` usable inside ``island``: NVML's links to island peers or switches;
    else the smi matrix's NV# to each peer, where a row of equal NV# beyond one GPU's links is NVSwitch."""
    buses = {g.pci_bus_id for g in island if g is not gpu}
    if gpu.nvlinks:
        return sum(1 for n in gpu.nvlinks if n.active and (n.remote_bus_id in buses or n.remote_type != "gpu"))
    counts = []
    for peer in island:
        if peer is gpu:
            continue
        kind = topology.links.get((gpu.index, peer.index)) or topology.links.get((peer.index, gpu.index)) or ""
        m = re.fullmatch(r"NV(\d+)", kind.upper())
        counts.append(int(m.group(1)) if m else 0)
    if not counts:
        return None
    if len(set(counts)) == 1 and sum(counts) > MAX_NVLINKS_PER_GPU:
        return counts[0]
    return sum(counts)


def _nvlink_expectation(island: Sequence[GpuInfo], topology: Topology) -> Expectation:
    per_gpu: list[tuple[float, str]] = []
    for g in island:
        gen, links = nvlink_generation(g), _links_into(g, island, topology)
        if gen is None or not links:
            return Expectation(None, f"NVLink generation or link count of GPU {g.index} unknown")
        bw = links * NVLINK_GBPS_PER_LINK[gen] * EFFICIENCY["nvlink"]
        per_gpu.append(
            (bw, f"NVLink{gen} x{links} links x {NVLINK_GBPS_PER_LINK[gen]:g} GB/s x {EFFICIENCY['nvlink']}")
        )
    gbps, how = min(per_gpu)
    return Expectation(round(gbps, 1), how)


def _pcie_expectation(gpus: Sequence[GpuInfo]) -> Expectation:
    per_gpu: list[tuple[float, str]] = []
    for g in gpus:
        p = g.pcie
        gen = p.max_gen or p.gen if p else None
        width = p.max_width or p.width if p else None
        if gen is None or gen not in PCIE_GBPS_PER_LANE or not width:
            return Expectation(None, f"PCIe generation or width of GPU {g.index} unknown")
        bw = width * PCIE_GBPS_PER_LANE[gen] * EFFICIENCY["pcie"]
        per_gpu.append((bw, f"PCIe gen{gen} x{width} x {PCIE_GBPS_PER_LANE[gen]:g} GB/s x {EFFICIENCY['pcie']}"))
    gbps, how = min(per_gpu)
    return Expectation(round(gbps, 1), how)


def expectations(
    tiers: Sequence[Tier],
    plan: LaunchPlan,
    topology: Topology,
    settings: PreflightSettings,
    recorded: Mapping[str, float] | None = None,
    recorded_source: str = "",
) -> dict[str, Expectation]:
    """Per tier: ``--expect`` (recorded x RECORDED_MARGIN) > config ``preflight.expect_busbw_gbps``
    > derived from the hardware (NVLink gen x links, else PCIe gen x width) > none (CPU ranks)."""
    islands = nvlink_islands(plan, topology)
    out: dict[str, Expectation] = {}
    for t in tiers:
        if recorded and t.name in recorded:
            out[t.name] = Expectation(
                round(recorded[t.name] * RECORDED_MARGIN, 2),
                f"{recorded[t.name]:g} GB/s recorded in {recorded_source} x {RECORDED_MARGIN}",
            )
        elif t.kind in settings.expect_busbw_gbps:
            out[t.name] = Expectation(
                settings.expect_busbw_gbps[t.kind], f"config preflight.expect_busbw_gbps.{t.kind}"
            )
        elif plan.backend != "nccl":
            out[t.name] = Expectation(None, "CPU ranks: no hardware expectation (give one in the config or --expect)")
        elif t.kind == "nvlink":
            island = next(isl for isl in islands if t.name == "nvlink:" + ",".join(str(g.index) for g in isl))
            out[t.name] = _nvlink_expectation(island, topology)
        else:
            gpus = [g for isl in islands for g in isl]
            one = len(islands) == 1 and len(gpus) > 1
            out[t.name] = _nvlink_expectation(islands[0], topology) if one else _pcie_expectation(gpus)
    return out


def network_expectations(topology: Topology) -> list[NetworkExpectation]:
    """Each active IB port's expected bus bandwidth (rate / 8 x EFFICIENCY["ib"]); reported only:
    node pairs are judged against each other and ``--expect``."""
    out = []
    for p in topology.infiniband:
        rate = p.rate_gbps
        if rate is None or p.state is None or "ACTIVE" not in p.state.upper():
            continue
        gbps = round(rate / 8 * EFFICIENCY["ib"], 1)
        out.append(NetworkExpectation(f"{p.device}/{p.port}", p.rate, gbps, measured=False))
    return out


def judge(
    tier: Tier,
    per_rank: Mapping[int, Mapping[str, Any]],
    expected: Expectation,
    size_bytes: int,
    iters: int,
    gpus: tuple[int, ...] = (),
) -> PreflightTier:
    """One tier's verdict from what each rank wrote (``{"tiers": {name: {"seconds", "correct"}}}``),
    as the report holds it."""
    seen = [per_rank.get(r, {}).get("tiers", {}).get(tier.name) for r in tier.ranks]
    missing = [r for r, s in zip(tier.ranks, seen, strict=True) if s is None]
    seconds = None if missing else max(float(s["seconds"]) for s in seen if s)
    correct = None if missing else all(bool(s["correct"]) for s in seen if s)
    busbw = _busbw_gbps(size_bytes, seconds, len(tier.ranks))
    status, msg = _verdict(missing, correct, busbw, expected)
    return PreflightTier(
        name=tier.name,
        kind=tier.kind,
        ranks=tier.ranks,
        gpus=gpus,
        size_bytes=size_bytes,
        iters=iters,
        seconds=seconds,
        algbw_gbps=round(size_bytes / seconds / 1e9, 2) if seconds else None,
        busbw_gbps=busbw,
        expected_busbw_gbps=expected.gbps,
        expected_source=expected.source,
        correct=correct,
        status=status,
        message=msg,
    )


def _busbw_gbps(size_bytes: int, seconds: float | None, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth of one all-reduce over ``ranks`` ranks; None: not measured."""
    return round(size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9, 2) if seconds else None


def _verdict(
    missing: Sequence[int], correct: bool | None, busbw: float | None, expected: Expectation
) -> tuple[Status, str]:
    """A tier's status and why."""
    if missing:
        return "fail", f"no result from rank(s) {', '.join(map(str, missing))}: the workers failed (see above)"
    if not correct:
        return "fail", "all-reduce returned wrong sums: a link or GPU corrupts data; drain the node"
    if expected.gbps is None:
        return "info", expected.source
    busbw = busbw or 0.0
    if busbw >= expected.gbps:
        return "pass", ""
    if busbw >= FAIL_BELOW * expected.gbps:
        return "warn", f"{100 * busbw / expected.gbps:.0f} % of the expected bandwidth"
    return "fail", (
        f"{100 * busbw / expected.gbps:.0f} % of the expected bandwidth: a link is down or traffic avoids "
        "it (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, a PCIe path); run openclaw-launch validate"
    )


def format_line(r: PreflightTier) -> str:
    """``PASS  nvlink:0,1  2 ranks  busbw 324.1 GB/s (expected >= 270.0: how)  1024 MiB x 20``."""
    bw = f"busbw {r.busbw_gbps:.1f} GB/s" if r.busbw_gbps is not None else "not measured"
    exp = f" (expected >= {r.expected_busbw_gbps:g}: {r.expected_source})" if r.expected_busbw_gbps is not None else ""
    size = f"{r.size_bytes / 2**20:g} MiB x {r.iters}"
    line = f"{r.status.upper():<4}  {r.name}  {len(r.ranks)} ranks  {bw}{exp}  {size}"
    return line + (f" - {r.message}" if r.message else "")


def default_size_bytes(plan: LaunchPlan, settings: PreflightSettings, size_mib: int | None) -> int:
    mib = size_mib or settings.size_mib or PREFLIGHT_SIZE_MIB["gpu" if plan.backend == "nccl" else "cpu"]
    return mib * 2**20
