"""An FSDP2 training on gloo (CPU) with no openclaw code: ``fully_shard`` on every block and on the
root, as torchtitan lays it out.

``--slow-rank R --slow-pct P``: rank R's forward does P % more work per step (each block repeats
its matmul on a share of its input: real CPU work, not a sleep). ``--slow-pace-pct P`` instead: its
first block repeats its matmul until P % of the job's pace as measured in this run (rank R's own
step less what it added, the median of its last 20 steps, from step 10) has passed: a slowdown of
P % however the host's load moves the step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque

from clean_exit import leave


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-pct", type=float, default=0.0)
    p.add_argument("--slow-pace-pct", type=float, default=0.0)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batch", type=int, default=512)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    extra = args.slow_pct / 100 if rank == args.slow_rank else 0.0
    added_s = [0.0]  # --slow-pace-pct: this step's extra work, seconds (the first block does it)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(args.width, args.width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.lin(x))
            if extra:  # more work on this rank: the block's matmul again (a step costs ~3 forwards)
                with torch.no_grad():
                    todo = extra * 3
                    while todo > 0:
                        rows = max(1, int(min(todo, 1.0) * x.shape[0]))
                        torch.mm(x[:rows], self.lin.weight)
                        todo -= 1.0
            if added_s[0]:
                with torch.no_grad():
                    end = time.perf_counter() + added_s[0]
                    while time.perf_counter() < end:
                        torch.mm(x[:16], self.lin.weight)
                added_s[0] = 0.0
            return y

    model = nn.Sequential(*(Block() for _ in range(args.blocks)))
    for block in model:
        fully_shard(block, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width)
    paces: deque[float] = deque(maxlen=20)  # seconds per step without what this rank added
    for _ in range(args.steps):
        started = time.perf_counter()
        added = 0.0
        if rank == args.slow_rank and args.slow_pace_pct and len(paces) >= 10:
            added = added_s[0] = args.slow_pace_pct / 100 * statistics.median(paces)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        paces.append(time.perf_counter() - started - added)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
    leave()
