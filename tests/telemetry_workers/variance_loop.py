"""A DDP training on gloo with no openclaw code whose batches differ in cost: every step one rank,
drawn at random, gets a batch ``--costly-pct`` % more costly (its forward takes that much longer),
as with unbucketed sequence lengths. ``--fixed-rank R`` is the control: rank R gets the costly batch
at every step (a fixed straggler, not variance).

The draw is the same on every rank (one seeded generator per rank, the same seed), so exactly one
rank has the costly batch at each step. The forward's cost is a sleep, as a GPU's kernels are to the
host: the effect stays the same on a loaded machine.
"""

from __future__ import annotations

import argparse
import random
import time

from clean_exit import leave


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--forward-ms", type=float, default=15.0, help="an ordinary batch's forward")
    p.add_argument("--costly-pct", type=float, default=60.0, help="how much more a costly batch costs")
    p.add_argument("--fixed-rank", type=int, default=-1, help="the control: this rank's batch is always costly")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    draw = random.Random(args.seed)  # the same sequence on every rank
    state = {"costly": False}

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            scale = 1 + args.costly_pct / 100 if state["costly"] else 1.0
            time.sleep(args.forward_ms * scale / 1000)
            return self.layer(x)

    model = DistributedDataParallel(Tiny())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        costly_rank = args.fixed_rank if args.fixed_rank >= 0 else draw.randrange(world)
        state["costly"] = costly_rank == rank
        x = torch.randn(8, 16)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
    leave()
