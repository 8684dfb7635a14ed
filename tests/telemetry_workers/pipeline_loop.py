"""A pipeline-parallel training on gloo (CPU) with no openclaw code: ``torch.distributed.pipelining``,
one stage per rank (``PipelineStage``), ``Schedule1F1B`` or ``ScheduleGPipe``.

``--heavy-stage S --heavy-layers K``: stage S holds K times the layers of the others (a partition
that puts too many layers on one stage). ``--schedule gpipe`` for GPipe.
"""

from __future__ import annotations

import argparse

from clean_exit import leave


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--layers", type=int, default=2, help="layers per stage")
    p.add_argument("--heavy-stage", type=int, default=-1)
    p.add_argument("--heavy-layers", type=float, default=3.0)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    torch.set_num_threads(1)
    layers = args.layers * (round(args.heavy_layers) if rank == args.heavy_stage else 1)
    stage_module = nn.Sequential(*(nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(layers)))
    # Static shapes (no shape inference); a later stage's input needs its gradient (sent back).
    micro = torch.empty(args.batch // args.microbatches, args.width, requires_grad=rank > 0)
    out = torch.empty(args.batch // args.microbatches, args.width)
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"), input_args=(micro,), output_args=(out,))
    loss_fn = lambda out, target: nn.functional.mse_loss(out, target)  # noqa: E731
    kind = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = kind(stage, n_microbatches=args.microbatches, loss_fn=loss_fn if rank == world - 1 else None)
    opt = torch.optim.SGD(stage_module.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width)
    target = torch.randn(args.batch, args.width)
    for _ in range(args.steps):
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
    leave()
