"""A pipeline-parallel training on gloo (CPU) with no openclaw code: one stage per rank, the
stage-to-stage traffic as torch.distributed.pipelining issues it (``P2POp`` of ``isend``/``irecv``,
``batch_isend_irecv``, ``Work.wait``), in GPipe's order (every forward, then every backward) or
1F1B's (warm-up forwards, then one forward and one backward in turn, then the cool-down).

torch 2.13's own ``torch.distributed.pipelining`` schedules deadlock on gloo once a stage's input
needs its gradient (stage 0 waits for its forward sends, stage 1 for its backward sends), so the
schedules are written out here with the same calls.

Every stage computes its input's gradient, the first one too (which a real first stage does not
need), and the loss on its output (which only the last stage's backward uses; about 0.3 ms a step
at width 384 and 64 rows, 0.8 % of a 16-layer stage's work): stages of as many layers then do the
same work, and a balanced pipeline is balanced.

``--heavy-stage S --heavy-layers K``: stage S holds K times the layers of the others (a partition
that puts too many layers on one stage); ``--heavy-extra-layers K``: K layers more instead;
``--heavy-pace-pct P``: stage S repeats a matmul after each micro-batch's forward until P % of the
job's pace as measured in this run (its own step less what it added, the median of its last 20
steps, from step 10) has passed, over the step: a slowdown of about P % however the host's load
moves the step. ``--heavy-work-pct P``: the same for P % of the stage's own work (its step less its
time in the point-to-point calls, where it waits for the other stages, and less what it added): a
stage with P % more work than the others, as one with P % more layers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from clean_exit import leave

T = TypeVar("T")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="layers per stage")
    p.add_argument("--heavy-stage", type=int, default=-1)
    p.add_argument("--heavy-layers", type=int, default=3)
    p.add_argument("--heavy-extra-layers", type=int, default=0, help="instead: this many layers more")
    p.add_argument("--heavy-pace-pct", type=float, default=0.0, help="instead: this % of the pace more")
    p.add_argument("--heavy-work-pct", type=float, default=0.0, help="instead: this % of its own work more")
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    layers = args.layers
    if rank == args.heavy_stage and not (args.heavy_pace_pct or args.heavy_work_pct):
        layers = layers + args.heavy_extra_layers if args.heavy_extra_layers else layers * args.heavy_layers
    stage = nn.Sequential(*(nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(layers)))
    opt = torch.optim.SGD(stage.parameters(), lr=1e-4)
    m = args.microbatches
    shape = (args.batch // m, args.width)
    data = torch.randn(m, *shape)
    target = torch.randn(m, *shape)

    p2p_s = [0.0]  # this step's time in point-to-point calls: its waits for the other stages

    def p2p(call: Callable[..., T], *call_args: Any) -> T:
        started = time.perf_counter()
        try:
            return call(*call_args)
        finally:
            p2p_s[0] += time.perf_counter() - started

    def exchange(ops: list[dist.P2POp]) -> None:
        for work in p2p(dist.batch_isend_irecv, ops):
            p2p(work.wait)

    def step(added_s: float) -> None:
        inputs: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        sends: list[dist.Work] = []

        def forward(i: int) -> None:
            if first:
                x = data[i].clone()
            else:
                x = torch.empty(shape)
                exchange([dist.P2POp(dist.irecv, x, rank - 1)])
            x.requires_grad_()
            y = stage(x)
            if added_s:  # this stage's extra work: a share of the step's, after each micro-batch
                with torch.no_grad():
                    end = time.perf_counter() + added_s / m
                    while time.perf_counter() < end:
                        torch.mm(y[:16].detach(), stage[0][0].weight)
            inputs.append(x)
            outputs.append(y)
            if not last:
                sends.extend(p2p(dist.batch_isend_irecv, [dist.P2POp(dist.isend, y.detach(), rank + 1)]))

        def backward(i: int) -> None:
            loss = nn.functional.mse_loss(outputs[i], target[i])  # every stage's: the same work
            if last:
                loss.backward()
            else:
                grad = torch.empty(shape)
                exchange([dist.P2POp(dist.irecv, grad, rank + 1)])
                torch.autograd.backward(outputs[i], grad)
            if not first:
                sends.extend(p2p(dist.batch_isend_irecv, [dist.P2POp(dist.isend, inputs[i].grad, rank - 1)]))

        if args.schedule == "gpipe":
            order = [("f", i) for i in range(m)] + [("b", i) for i in range(m)]
        else:
            warmup = min(world - rank - 1, m)
            order = [("f", i) for i in range(warmup)]
            for i in range(m - warmup):
                order += [("f", warmup + i), ("b", i)]
            order += [("b", i) for i in range(m - warmup, m)]
        for kind, i in order:
            (forward if kind == "f" else backward)(i)
        for work in sends:
            p2p(work.wait)

    paces: deque[float] = deque(maxlen=20)  # seconds per step without what this stage added
    works: deque[float] = deque(maxlen=20)  # its own work per step: the pace less its point-to-point calls
    for _ in range(args.steps):
        started = time.perf_counter()
        added = 0.0
        if rank == args.heavy_stage and len(paces) >= 10:
            added = args.heavy_pace_pct / 100 * statistics.median(paces)
            added += args.heavy_work_pct / 100 * statistics.median(works)
        p2p_s[0] = 0.0
        opt.zero_grad()
        step(added)
        opt.step()
        paces.append(time.perf_counter() - started - added)
        works.append(paces[-1] - p2p_s[0])
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
    leave()
