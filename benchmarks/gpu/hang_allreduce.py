"""NCCL all-reduce loop for benchmarks/gpu/hang_gpu.sh: after --at steps, rank --rank stops entering
the all-reduce (a pure-Python sleep loop); the other rank blocks in NCCL, its CPU in the sync below.
Steps come from telemetry.step() (no optimizer here)."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from openclaw_launch import telemetry


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=50)
    p.add_argument("--steps", type=int, default=100000)
    args = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = dist.get_rank()
    a = torch.randn(2048, 2048, device="cuda")
    grad = torch.randn(16 << 20, device="cuda")
    for step in range(args.steps):
        if step == args.at and rank == args.rank:
            print(f"HANGING rank {rank} at step {step} {time.time():.3f}", flush=True)
            while True:
                time.sleep(0.1)  # BLOCKS-HERE: never enters the next all-reduce
        with telemetry.section("compute"):
            b = a @ a
        dist.all_reduce(grad)
        with telemetry.section("sync"):
            float(grad[0].item() + b[0, 0].item())  # BLOCKS-HERE for the peer: waits for the NCCL kernel
        telemetry.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
