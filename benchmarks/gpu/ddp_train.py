"""A small DDP training on GPUs for launcher comparisons: throughput in samples/s from rank 0."""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    dev = local_rank if torch.cuda.device_count() > local_rank else 0
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=torch.device("cuda", dev))
    torch.manual_seed(0)
    width, batch, steps, warmup = 4096, 512, 60, 10
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(8)]).cuda()
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")
    for step in range(steps + warmup):
        if step == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    if dist.get_rank() == 0:
        sps = steps * batch * dist.get_world_size() / dt
        stats = {"samples_per_s": round(sps, 1), "step_ms": round(dt / steps * 1000, 3)}
        print("DDP " + json.dumps(stats), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
