"""Four gloo ranks with the process groups of a 2-stage x 2-replica layout (identity order: pipeline
groups {0, 2} and {1, 3}, data-parallel groups {0, 1} and {2, 3}) and the world. Each step: a
forward and backward, then stage 0's ranks (0 and 1) work ``--slow-ms`` longer, then an all-reduce
in the rank's pipeline group (stage 1 waits there for stage 0), in its data-parallel group and in the
world (little waiting: the replicas of a stage arrive together). No openclaw code."""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from clean_exit import leave


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--slow-ms", type=float, default=20.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pipeline = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replicas = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    model = torch.nn.Linear(32, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    for _ in range(args.steps):
        model(x).square().mean().backward()
        if rank in (0, 1):
            time.sleep(args.slow_ms / 1000)
        t = torch.ones(4)
        dist.all_reduce(t, group=pipeline[rank % 2])
        dist.all_reduce(t, group=replicas[rank // 2])
        dist.all_reduce(t)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    leave()


if __name__ == "__main__":
    main()
