"""The preflight worker: started by the launcher on every planned rank, with the plan's binding,
environment and MPS, it times an all-reduce per tier and writes ``rank-<RANK>.json``.

Runs in the worker process only (it imports torch). The node's ranks form their own world on
127.0.0.1 (the spec's port): a preflight measures one node, whatever the job's world is.

Usage: ``python -m openclaw_launch.preflight.worker SPEC.json OUT_DIR``. The spec:
``{"ranks": [global ranks, local order], "port": int, "device": "cuda"|"cpu", "size_bytes": int,
"iters": int, "warmup": int, "timeout_s": float, "tiers": [{"name": str, "ranks": [...]}]}``.
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


def run(spec: Mapping[str, Any], out_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank = int(env["RANK"])
    ranks = [int(r) for r in spec["ranks"]]
    index = ranks.index(rank)
    device, backend = select_device(spec["device"], env, torch)
    timeout = datetime.timedelta(seconds=float(spec.get("timeout_s", 300)))
    extra = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{int(spec['port'])}",
        rank=index,
        world_size=len(ranks),
        timeout=timeout,
        **extra,
    )
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
        dist.all_reduce(fence)
    finally:
        dist.destroy_process_group()
    doc = {"rank": rank, "device": str(device), "backend": backend, "tiers": results}
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
