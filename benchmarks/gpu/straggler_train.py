"""A GPT-style DDP training on GPUs (bf16, 12 layers x 1024, seq 1024) for the straggler proofs.

``--slow-rank R --slow-phase input --slow-ms M``: rank R's DataLoader is M ms slower per batch.
``--slow-phase compute``: rank R does M ms of extra GPU matmuls per step (no host sync).
``--api``: mark data/compute with openclaw_launch.telemetry sections; otherwise no code change.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from openclaw_launch import telemetry


class Tokens(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, n: int, seq: int, delay_ms: float) -> None:
        self.n, self.seq, self.delay_s = n, seq, delay_ms / 1000

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.randint(0, 32000, (self.seq + 1,), generator=torch.Generator().manual_seed(i))


class SlowCollate:
    def __init__(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1000

    def __call__(self, items: list[torch.Tensor]) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return torch.stack(items)


class Extra(nn.Module):
    """Identity after ``n`` extra bf16 matmuls on the GPU: a rank with more GPU work."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.n:
            return x
        a = torch.randn(4096, 4096, device=x.device, dtype=torch.bfloat16)
        for _ in range(self.n):
            a = a @ a
            a = a / a.abs().max()
        return x + (a.float().sum() * 0).to(x.dtype)


def matmuls_for(ms: float, device: torch.device) -> int:
    """How many of Extra's matmuls take ``ms`` on this GPU (timed after a warm-up)."""
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    for _ in range(10):
        a = a @ a
        a = a / a.abs().max()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        a = a @ a
        a = a / a.abs().max()
    torch.cuda.synchronize()
    return max(1, round(ms / ((time.perf_counter() - start) * 1000 / 50)))


class Gpt(nn.Module):
    def __init__(self, extra: int, d: int = 1024, layers: int = 12) -> None:
        super().__init__()
        self.embed = nn.Embedding(32000, d)
        layer = nn.TransformerEncoderLayer(d, 16, 4 * d, batch_first=True, norm_first=True, dropout=0.0)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.extra = Extra(extra)
        self.head = nn.Linear(d, 32000)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.extra(self.blocks(self.embed(tokens), mask=mask, is_causal=True)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-phase", choices=("input", "compute"), default="input")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--api", action="store_true")
    args = p.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank = dist.get_rank()
    slow = rank == args.slow_rank
    extra = matmuls_for(args.slow_ms, device) if slow and args.slow_phase == "compute" and args.slow_ms else 0
    delay = args.slow_ms if slow and args.slow_phase == "input" else 0.0
    model = nn.parallel.DistributedDataParallel(Gpt(extra).to(device), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = Tokens(args.steps * args.batch, args.seq, delay)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, collate_fn=SlowCollate(delay), pin_memory=True)
    times: list[float] = []
    t0 = time.perf_counter()
    it = iter(loader)
    for _ in range(args.steps):
        with telemetry.section("data") if args.api else _nothing():
            batch = next(it).to(device, non_blocking=True)
        with telemetry.section("compute") if args.api else _nothing():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(batch[:, :-1])
                loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_value = loss.item()  # the host waits for the GPU here, as most training loops do
        if args.api:
            telemetry.step()
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
    tail = sorted(times[20:])
    print(
        f"rank {rank}: median step {1000 * tail[len(tail) // 2]:.2f} ms, loss {loss_value:.3f}, extra {extra}",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
