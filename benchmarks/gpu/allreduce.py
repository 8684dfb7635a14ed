"""NCCL all-reduce bus bandwidth sweep, one process per GPU. Launcher-agnostic (torchrun env).

Works with ordered devices (cuda:LOCAL_RANK is this rank's GPU) and isolated ones (the rank sees
only its own GPU as cuda:0). Rank 0 prints one JSON line: {"size_bytes": busbw_GBps, ...}.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = local_rank if torch.cuda.device_count() > local_rank else 0
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=torch.device("cuda", dev))
    world = dist.get_world_size()
    result: dict[str, float] = {}
    for shift in range(20, 31, 2):  # 1 MiB .. 1 GiB
        n = (1 << shift) // 4
        x = torch.ones(n, device="cuda", dtype=torch.float32)
        iters = 20 if shift < 28 else 10
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        result[str(1 << shift)] = round((1 << shift) / dt * 2 * (world - 1) / world / 1e9, 2)
    if dist.get_rank() == 0:
        print("ALLREDUCE " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
