"""A small real DDP training: gloo on CPU, NCCL on GPU. Runs unchanged under torchrun.

It reads only what torchrun provides (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*),
so it is also the yardstick for comparing launchers. ``--straggler-rank R
--straggler-ms M`` makes one rank slow, in its input stage (its DataLoader, the
default) or in compute (``--straggler-phase compute``, extra matrix work in its
forward pass): the situation a launcher should be able to explain. It uses no
openclaw-launch API: the launcher's zero-code hooks see the DataLoader, the DDP
forward/backward and the optimizer.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

W_TRUE = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))


class Samples(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random inputs labelled by a fixed linear teacher: a task the model can learn."""

    def __init__(self, size: int, seed: int) -> None:
        self.x = torch.randn(size, 64, generator=torch.Generator().manual_seed(seed))
        self.y = (self.x @ W_TRUE).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


class SlowCollate:
    """The default collate, ``delay_ms`` slower per batch: a slow input pipeline."""

    def __init__(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1000

    def __call__(self, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        xs, ys = zip(*batch, strict=True)
        return torch.stack(xs), torch.stack(ys)


class Spin(nn.Module):
    """Identity, after about ``ms`` of extra matrix work on the input's device: slow compute."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ms:
            return x
        a = torch.randn(256, 256, device=x.device)
        end = time.perf_counter() + self.ms / 1000
        while time.perf_counter() < end:
            a = torch.tanh(a @ a)
            if x.is_cuda:
                torch.cuda.synchronize()
        return x + a.sum() * 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-ms", type=float, default=0.0)
    p.add_argument("--straggler-phase", choices=("input", "compute"), default="input")
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
    slow = rank == args.straggler_rank
    spin_ms = args.straggler_ms if slow and args.straggler_phase == "compute" else 0.0
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10), Spin(spin_ms)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(
        Samples(args.steps * args.batch_size, seed=1234 + rank),
        batch_size=args.batch_size,
        collate_fn=SlowCollate(args.straggler_ms if slow and args.straggler_phase == "input" else 0.0),
    )

    step_s: list[float] = []
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if use_cuda:
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
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
    # torch's gloo teardown at interpreter exit can abort a finished rank ("terminate called without
    # an active exception", about 1 run in 5 with torch 2.13 on CPU): run the exit handlers (the
    # launcher's telemetry flushes there), then leave before C++ static destructors.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
