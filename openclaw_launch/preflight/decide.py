"""The preflight's decision: which GPUs are slow, which node pairs are slow, which nodes to leave
out, and the exit code. Pure: the workers' job-wide results (``world``, the same on every node) ->
one ``PreflightDecision``, so every node's launcher decides the same.

A GPU (a CPU rank) is **slow** when its GEMM TFLOPS are more than ``slow_pct`` % below its node's
median of the same device, when its node's median is that far below the job's median of node
medians (a node slow as a whole), or below ``--expect``'s floor. A **pair** is slow when its bus
bandwidth is that far below the reference (the median over the nodes of each node's best pair) or
below ``--expect``'s floor; it fails on wrong sums or a missing result. A node is **excluded** for
a slow GPU, or when all its pairs are slow or failed while some pair is not (its own links, not the
fabric's). A bad pair between two kept nodes is *unexplained* (two nodes: either end).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_launch.agents.hostlist import compress_hostlist
from openclaw_launch.preflight.rounds import pair_name, round_robin
from openclaw_launch.report.preflight import PreflightDecision, PreflightExclusion, PreflightGemm, PreflightPair

#: The exit code "measured, and these nodes should be left out (the exclude list); nothing else
#: failed". 0, 1, 2 and 3 are docs/preflight.md's others; 128+N a signal.
EXCLUDED_SOME = 4
#: The GEMM: n x n by n x n, bf16 on GPUs (an H200 does one n=8192 product in about 2 ms), float32
#: on CPU ranks; the best of GEMM_REPS repetitions of GEMM_MATMULS products. A CPU repetition is one
#: product (well under a scheduler slice), so a host busy with other work still shows, in one of
#: many repetitions, what the rank's cores do when it runs.
GEMM_N: Mapping[str, int] = {"gpu": 8192, "cpu": 256}
GEMM_REPS: Mapping[str, int] = {"gpu": 10, "cpu": 50}
GEMM_MATMULS: Mapping[str, int] = {"gpu": 10, "cpu": 1}


@dataclass(frozen=True)
class Floors:
    """``--expect``'s floors (recorded x RECORDED_MARGIN): GEMM TFLOPS by ``gemm_key``, pair GB/s by name."""

    gemm_tflops: Mapping[str, float]
    pair_gbps: Mapping[str, float]


def gemm_key(entry: Mapping[str, Any]) -> str:
    """What a GEMM result is recorded under: the GPU's UUID, else ``NODE/local_rank=K``."""
    gemm = entry.get("gemm") or {}
    return str(gemm.get("gpu_uuid") or f"{entry['node']}/local_rank={entry['local_rank']}")


def node_order(world: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One entry per node (its first rank's), in node-rank order."""
    first: dict[int, Mapping[str, Any]] = {}
    for e in sorted(world, key=lambda e: int(e["rank"])):
        first.setdefault(int(e["node_rank"]), e)
    return [first[k] for k in sorted(first)]


def _below(value: float, reference: float, slow_pct: float) -> bool:
    return value < reference * (1 - slow_pct / 100)


def judge_gemm(world: Sequence[Mapping[str, Any]], slow_pct: float, floors: Floors) -> list[PreflightGemm]:
    measured = [e for e in world if e.get("gemm")]
    by_node: dict[tuple[str, str], list[float]] = {}
    for e in measured:
        by_node.setdefault((e["gemm"]["device"], e["node"]), []).append(float(e["gemm"]["tflops"]))
    node_median = {k: statistics.median(v) for k, v in by_node.items()}
    job_median = {
        device: statistics.median(m for (d, _), m in node_median.items() if d == device) for device, _ in node_median
    }
    out = []
    for e in sorted(measured, key=lambda e: int(e["rank"])):
        g = e["gemm"]
        tflops, device = float(g["tflops"]), g["device"]
        node_med, job_med = node_median[(device, e["node"])], job_median[device]
        floor = floors.gemm_tflops.get(gemm_key(e))
        why = ""
        if _below(tflops, node_med, slow_pct):
            why = f"{_pct_below(tflops, node_med)} % below its node's median {node_med:.3g} TFLOPS"
        elif _below(node_med, job_med, slow_pct):
            pct = _pct_below(node_med, job_med)
            why = f"its node's median {node_med:.3g} TFLOPS is {pct} % below the job's {job_med:.3g}"
        elif floor is not None and tflops < floor:
            why = f"below the --expect floor {floor:.3g} TFLOPS"
        out.append(
            PreflightGemm(
                node=e["node"],
                rank=int(e["rank"]),
                local_rank=int(e["local_rank"]),
                gpu=g.get("gpu_index"),
                gpu_uuid=g.get("gpu_uuid"),
                device=device,
                dtype=g["dtype"],
                n=int(g["n"]),
                tflops=round(tflops, 4),
                node_median_tflops=round(node_med, 4),
                job_median_tflops=round(job_med, 4),
                expected_tflops=floor,
                status="slow" if why else "pass",
                message=why,
            )
        )
    return out


def _pct_below(value: float, reference: float) -> int:
    return round(100 * (1 - value / reference)) if reference else 0


def pair_busbw_gbps(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce over ``ranks`` ranks."""
    return round(size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9, 3)


def judge_pairs(
    world: Sequence[Mapping[str, Any]], size_bytes: int, iters: int, slow_pct: float, floors: Floors
) -> list[PreflightPair]:
    nodes = [e["node"] for e in node_order(world)]
    ranks_of = {n: sorted(int(e["rank"]) for e in world if e["node"] == n) for n in nodes}
    measured: list[tuple[int, tuple[str, str], float | None, bool | None]] = []
    for index, round_pairs in enumerate(round_robin(len(nodes))):
        for a, b in round_pairs:
            name, members = pair_name(nodes[a], nodes[b]), ranks_of[nodes[a]] + ranks_of[nodes[b]]
            seen = [next((e.get("pairs", {}).get(name) for e in world if int(e["rank"]) == r), None) for r in members]
            if any(s is None for s in seen):
                measured.append((index, (nodes[a], nodes[b]), None, None))
                continue
            slowest = max(float(s["seconds"]) for s in seen if s)
            measured.append((index, (nodes[a], nodes[b]), slowest, all(bool(s["correct"]) for s in seen if s)))
    busbw = {
        pair: pair_busbw_gbps(size_bytes, t, len(ranks_of[pair[0]]) + len(ranks_of[pair[1]]))
        for _, pair, t, ok in measured
        if t and ok
    }
    best = [max((bw for pair, bw in busbw.items() if n in pair), default=None) for n in nodes]
    reference = statistics.median(b for b in best if b is not None) if any(b is not None for b in best) else None
    out = []
    for index, pair, seconds, correct in measured:
        name, bw = pair_name(*pair), busbw.get(pair)
        floor = floors.pair_gbps.get(name)
        if seconds is None:
            status, why = "fail", "no result from a rank of the pair: the workers failed (see above)"
        elif not correct:
            status, why = "fail", "all-reduce returned wrong sums: a link or NIC corrupts data"
        elif bw is not None and reference is not None and _below(bw, reference, slow_pct):
            status, why = "slow", f"{_pct_below(bw, reference)} % below the reference {reference:.3g} GB/s"
        elif bw is not None and floor is not None and bw < floor:
            status, why = "slow", f"below the --expect floor {floor:.3g} GB/s"
        else:
            status, why = "pass", ""
        out.append(
            PreflightPair(
                name=name,
                nodes=pair,
                round=index,
                ranks=tuple(ranks_of[pair[0]] + ranks_of[pair[1]]),
                size_bytes=size_bytes,
                iters=iters,
                seconds=seconds,
                busbw_gbps=bw,
                reference_busbw_gbps=reference,
                expected_busbw_gbps=floor,
                correct=correct,
                status=status,
                message=why,
            )
        )
    return out


def decide(
    world: Sequence[Mapping[str, Any]], size_bytes: int, iters: int, slow_pct: float, floors: Floors
) -> PreflightDecision:
    """The whole job's decision from every rank's results (the ``world`` every worker gathered)."""
    order = node_order(world)
    nodes = [e["node"] for e in order]
    host_of = {e["node"]: e.get("host") or e["node"] for e in order}
    gemm = judge_gemm(world, slow_pct, floors)
    pairs = judge_pairs(world, size_bytes, iters, slow_pct, floors)
    reasons: dict[str, list[str]] = {n: [] for n in nodes}
    for g in gemm:
        if g.status != "pass":
            what = f"GPU {g.gpu}" if g.gpu is not None else f"local rank {g.local_rank}"
            reasons[g.node].append(f"GEMM: {what} {g.tflops:.3g} TFLOPS, {g.message}")
    good = any(p.status == "pass" for p in pairs)
    for n in nodes:
        mine = [p for p in pairs if n in p.nodes]
        if good and mine and all(p.status != "pass" for p in mine):
            reasons[n].append(f"pairs: all {len(mine)} of its pairs are slow or failed, others are not")
    excluded = tuple(PreflightExclusion(n, host_of[n], tuple(reasons[n])) for n in nodes if reasons[n])
    out = {x.node for x in excluded}
    unexplained = tuple(f"{p.name}: {p.message}" for p in pairs if p.status != "pass" and not out.intersection(p.nodes))
    return PreflightDecision(
        slow_pct=slow_pct,
        nodes=tuple(nodes),
        rounds=len(round_robin(len(nodes))),
        gemm=tuple(gemm),
        pairs=tuple(pairs),
        excluded=excluded,
        exclude_hostlist=compress_hostlist([x.host for x in excluded]),
        unexplained=unexplained,
    )


def exit_code(tiers_failed: bool, decision: PreflightDecision | None) -> int:
    """1: a tier failed or a pair no exclusion explains; EXCLUDED_SOME: nodes to leave out and
    nothing else wrong; 0: neither."""
    if tiers_failed or (decision is not None and decision.unexplained):
        return 1
    return EXCLUDED_SOME if decision is not None and decision.excluded else 0


def format_decision(d: PreflightDecision) -> list[str]:
    """The console lines: one per slow GPU, one per pair, one per excluded node."""
    lines = []
    for g in d.gemm:
        what = f"gpu:{g.gpu}" if g.gpu is not None else f"local_rank:{g.local_rank}"
        line = f"{g.status.upper():<4}  gemm {g.node} {what}  {g.tflops:.3g} TFLOPS {g.dtype} n={g.n}"
        lines.append(line + (f" - {g.message}" if g.message else ""))
    for p in d.pairs:
        bw = f"busbw {p.busbw_gbps:.3g} GB/s" if p.busbw_gbps is not None else "not measured"
        line = f"{p.status.upper():<4}  {p.name}  round {p.round}  {len(p.ranks)} ranks  {bw}"
        lines.append(line + (f" - {p.message}" if p.message else ""))
    for x in d.excluded:
        lines.append(f"EXCLUDE  {x.host}  {'; '.join(x.reasons)}")
    return lines
