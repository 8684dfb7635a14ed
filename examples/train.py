"""A small real DDP training: gloo on CPU, NCCL on GPU. Runs unchanged under torchrun.

It reads only what torchrun provides (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*),
so it is also the yardstick for comparing launchers. ``--straggler-rank R
--straggler-ms M`` makes one rank slow in its input stage, the situation a
launcher should be able to explain.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-ms", type=float, default=0.0)
    args = p.parse_args()

    use_cuda = torch.cuda.is_available() and os.environ.get("OPENCLAW_BACKEND", "nccl") != "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if use_cuda:
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234 + rank)
    w_true = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))

    step_s: list[float] = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(args.batch_size, 64, generator=gen)
        y = (x @ w_true).argmax(dim=1)
        if rank == args.straggler_rank:
            time.sleep(args.straggler_ms / 1000)
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if use_cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  {step_s[-1] * 1000:.1f} ms/step", flush=True)

    tail = sorted(step_s[len(step_s) // 3 :])
    median_ms = tail[len(tail) // 2] * 1000
    print(
        f"rank {rank}/{world} on {device} (cpus {os.environ.get('OPENCLAW_CPUS', '?')}): "
        f"median step {median_ms:.1f} ms, final loss {loss.item():.4f}",
        flush=True,
    )
    dist.barrier()  # nobody tears down while a peer still talks to it (gloo aborts on a closed peer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
