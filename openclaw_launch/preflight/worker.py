"""The preflight worker: started by the launcher on every planned rank, with the plan's binding,
environment and MPS, it times an all-reduce per tier, a GEMM per GPU (per CPU rank) and an
all-reduce per node pair, and writes ``rank-<RANK>.json``.

Runs in the worker process only (it imports torch). For the tiers the node's ranks form a world of
their own on 127.0.0.1 (the spec's port).

Usage: ``python -m openclaw_launch.preflight.worker SPEC.json OUT_DIR``. The spec:
``{"ranks": [global ranks, local order], "port": int, "device": "cuda"|"cpu", "size_bytes": int,
"iters": int, "warmup": int, "timeout_s": float, "tiers": [{"name": str, "ranks": [...]}], "node": str,
"node_rank": int, "host": str, "job": bool, "gemm": {"n": int, "reps": int, "matmuls": int, "ranks":
{RANK: {"gpu_index", "gpu_uuid"}}}}``. With ``job`` the ranks then meet in the job's world (its
MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) for the GEMMs and the node pairs; else the GEMMs run in
the node's world. Each rank's file holds ``world``: every rank's GEMM and pair results, gathered.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from openclaw_launch.preflight.measure import slowdown, time_gemm, time_pair
from openclaw_launch.preflight.rounds import pair_name, round_robin


def select_device(kind: str, env: Mapping[str, str], torch: Any) -> tuple[Any, str]:
    """(device, backend). GPU ranks use their planned GPU: ``OPENCLAW_CUDA_DEVICE_INDEX`` (0 when
    the rank sees only its own GPU), as ``cuda:LOCAL_RANK`` is not the planned GPU with
    procs_per_gpu > 1 or ``--virtual-local-rank``."""
    if kind != "cuda":
        return torch.device("cpu"), "gloo"
    index = int(env.get("OPENCLAW_CUDA_DEVICE_INDEX") or 0)
    torch.cuda.set_device(index)
    return torch.device("cuda", index), "nccl"


def _sync(device: Any, torch: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_allreduce(
    dist: Any, torch: Any, group: Any, device: Any, size_bytes: int, iters: int, warmup: int
) -> tuple[float, bool]:
    """Seconds per all-reduce of ``size_bytes`` float32 in ``group``, and whether one sum of ones
    came back as the group size everywhere (a corrupting link shows here, not in the timing)."""
    n = max(1, size_bytes // 4)
    x = torch.ones(n, dtype=torch.float32, device=device)
    dist.all_reduce(x, group=group)
    correct = bool((x == float(dist.get_world_size(group))).all().item())
    for _ in range(warmup):
        dist.all_reduce(x, group=group)
    _sync(device, torch)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x, group=group)
    _sync(device, torch)
    return (time.perf_counter() - start) / iters, correct


def _init(dist: Any, backend: str, address: str, rank: int, world: int, spec: Mapping[str, Any], device: Any) -> None:
    """Join the world at ``address``. The node's own world (the spec's port) makes its store on its
    rank 0: under TORCHELASTIC_USE_AGENT_STORE=True torch's ``tcp://`` would make every rank a client
    of a store nobody hosts there (only the job's MASTER_PORT is the launcher's, agents/worker_store.py)."""
    extra = {"device_id": device} if device.type == "cuda" else {}
    timeout = datetime.timedelta(seconds=float(spec.get("timeout_s", 300)))
    if address == f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}":
        dist.init_process_group(
            backend, init_method=f"tcp://{address}", rank=rank, world_size=world, timeout=timeout, **extra
        )
        return
    host, port = address.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout, multi_tenant=True)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout, **extra)


def _gemm(
    dist: Any, torch: Any, device: Any, spec: Mapping[str, Any], rank: int, factor: float
) -> dict[str, Any] | None:
    """This rank's GEMM, in the current world: GPUs all at once (each its own), CPU ranks one at a
    time (they may share cores, as loopback nodes do). Only the first rank of each GPU runs it."""
    gemm, fence = spec["gemm"], torch.zeros(1, device=device)
    mine = gemm["ranks"].get(str(rank))
    turns = [None] if device.type == "cuda" else range(dist.get_world_size())
    result = None
    for turn in turns:
        dist.all_reduce(fence)
        if mine is not None and turn in (None, dist.get_rank()):
            result = {**time_gemm(torch, device, gemm["n"], gemm["reps"], gemm["matmuls"], factor), **mine}
            cpu = f"cpu x{torch.get_num_threads()} threads"  # CPU ranks compare with ranks of as many threads
            result["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu
    dist.all_reduce(fence)
    return result


def _pairs(
    dist: Any, torch: Any, device: Any, spec: Mapping[str, Any], me: Mapping[str, Any], factor: float
) -> dict[str, Any]:
    """Every node pair's all-reduce (all ranks of both nodes), round by round; the pairs of a round
    at once. The layout comes from the ranks themselves (each knows only its own node)."""
    layout: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(layout, {"rank": me["rank"], "node": me["node"], "node_rank": me["node_rank"]})
    names = {int(e["node_rank"]): e["node"] for e in layout}
    order = sorted(names)
    members = {k: sorted(int(e["rank"]) for e in layout if int(e["node_rank"]) == k) for k in order}
    schedule = [[(order[a], order[b]) for a, b in pairs] for pairs in round_robin(len(order))]
    groups = {pair: dist.new_group(members[pair[0]] + members[pair[1]]) for pairs in schedule for pair in pairs}
    fence, out = torch.zeros(1, device=device), {}
    for pairs in schedule:
        dist.all_reduce(fence)  # one round at a time; its pairs are disjoint
        for a, b in pairs:
            if me["node_rank"] in (a, b):
                seconds, correct = time_pair(
                    dist,
                    torch,
                    groups[(a, b)],
                    device,
                    int(spec["size_bytes"]),
                    int(spec["iters"]),
                    int(spec["warmup"]),
                    factor,
                )
                out[pair_name(names[a], names[b])] = {"seconds": seconds, "correct": correct}
    dist.all_reduce(fence)
    return out


def run(spec: Mapping[str, Any], out_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank = int(env["RANK"])
    ranks = [int(r) for r in spec["ranks"]]
    index = ranks.index(rank)
    device, backend = select_device(spec["device"], env, torch)
    factor = slowdown(env)
    me: dict[str, Any] = {
        "rank": rank,
        "local_rank": int(env.get("LOCAL_RANK", index)),
        "node": spec["node"],
        "node_rank": int(spec["node_rank"]),
        "host": spec["host"],
        "gemm": None,
        "pairs": {},
    }
    world: list[Any] = [None]
    _init(dist, backend, f"127.0.0.1:{int(spec['port'])}", index, len(ranks), spec, device)
    fence = torch.zeros(1, device=device)
    results: dict[str, Any] = {}
    try:
        groups = [(t, dist.new_group([ranks.index(r) for r in t["ranks"]])) for t in spec["tiers"]]
        for tier, group in groups:  # one tier at a time: tiers must not share links while timed
            dist.all_reduce(fence)
            if rank in tier["ranks"]:
                seconds, correct = time_allreduce(
                    dist, torch, group, device, int(spec["size_bytes"]), int(spec["iters"]), int(spec["warmup"])
                )
                results[tier["name"]] = {"seconds": seconds, "correct": correct}
        if not spec["job"]:
            me["gemm"] = _gemm(dist, torch, device, spec, rank, factor)
            world = [None] * len(ranks)
            dist.all_gather_object(world, me)
        dist.all_reduce(fence)
    finally:
        dist.destroy_process_group()
    if spec["job"]:  # the whole job's world, at the job's MASTER_ADDR:MASTER_PORT
        _init(dist, backend, f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", rank, int(env["WORLD_SIZE"]), spec, device)
        try:
            me["gemm"] = _gemm(dist, torch, device, spec, rank, factor)
            me["pairs"] = _pairs(dist, torch, device, spec, me, factor)
            world = [None] * dist.get_world_size()
            dist.all_gather_object(world, me)
        finally:
            dist.destroy_process_group()
    doc = {"rank": rank, "device": str(device), "backend": backend, "tiers": results, "world": world}
    tmp = out_dir / f".rank-{rank}.json"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out_dir / f"rank-{rank}.json")
    return doc


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m openclaw_launch.preflight.worker SPEC.json OUT_DIR", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    run(spec, Path(argv[1]), os.environ)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
