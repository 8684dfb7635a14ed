"""A nanoGPT-style DDP training for benchmarks/gpu/diagnosis_default.sh and overhead_default.sh, with
no openclaw code: a GPT (``--layers`` x ``--width``, 4 x 512 by default) on a gloo group (two ranks
share the one GPU under MPS; ``--backend nccl`` for one rank per GPU), batches sliced from a token
tensor inside the loop (``--loader``: through a ``DataLoader`` instead).

``--slow-gpu-ms M``: rank ``--slow-rank`` does about M ms of extra GPU matmuls in its forward (no host
sync). ``--slow-input-ms M``: it sleeps M ms per batch, in ``get_batch`` (an in-loop input slowdown)
or, with ``--loader``, in the DataLoader's collate function. ``--hang-at-step K``: it sleeps for an
hour in its loop at step K (a hang in Python). ``--hang-kernel-at-step K``: at step K its forward
launches a GPU kernel that spins for ``--hang-kernel-s`` (a kernel that does not end).
``--accumulation K``: each optimizer step is K micro-batches (DDP's ``no_sync`` on the first K-1;
the extra GPU work then runs in every micro-batch's forward). ``--fsdp2``: ``fully_shard`` on every
block and on the root instead of DDP (torchtitan's layout).
``--device cpu``: the same on the CPU, smaller (the script's own check on a machine without a GPU).
Prints ``rank R: median step X ms`` over the steps after the 20th, and ``rank R: mean step X ms``
over the steps after ``--warmup`` (the GPU synchronized at both ends: throughput).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


class Extra(nn.Module):
    """Identity after ``n`` extra matmuls: a rank with more GPU work (nothing waits for them)."""

    def __init__(self, n: int, side: int) -> None:
        super().__init__()
        self.n, self.side = n, side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.n:
            return x
        a = torch.randn(self.side, self.side, device=x.device, dtype=x.dtype)
        for _ in range(self.n):
            a = a @ a
            a = a / a.abs().max()
        return x + (a.sum() * 0).to(x.dtype)


def matmuls_for(ms: float, device: torch.device, side: int, dtype: torch.dtype) -> int:
    """How many of Extra's matmuls take ``ms`` here (timed once before training)."""
    if ms <= 0:
        return 0
    extra = Extra(50, side)
    x = torch.zeros(1, device=device, dtype=dtype)
    extra(x)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    extra(x)
    sync()
    return max(1, round(ms / ((time.perf_counter() - start) * 1000 / 50)))


class Spin(nn.Module):
    """Identity, except that its forward launches a kernel spinning ``cycles`` GPU cycles when armed."""

    def __init__(self) -> None:
        super().__init__()
        self.cycles = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cycles:
            torch.cuda._sleep(self.cycles)
            self.cycles = 0
        return x


class Gpt(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, extra: Extra) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True, dropout=0.0)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.extra = extra
        self.spin = Spin()
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.spin(self.extra(self.blocks(self.embed(tokens), mask=mask, is_causal=True))))


def loader(tokens: torch.Tensor, seq: int, batch: int, slow_s: float) -> torch.utils.data.DataLoader:
    """Endless random windows of ``tokens`` through a DataLoader (in the main process); each batch's
    collate sleeps ``slow_s`` (a slow input pipeline)."""

    class Windows(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            generator = torch.Generator().manual_seed(2)
            while True:
                start = int(torch.randint(len(tokens) - seq - 1, (1,), generator=generator))
                yield tokens[start : start + seq], tokens[start + 1 : start + seq + 1]

    def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if slow_s:
            time.sleep(slow_s)
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    return torch.utils.data.DataLoader(Windows(), batch_size=batch, collate_fn=collate, pin_memory=False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-gpu-ms", type=float, default=0.0)
    p.add_argument("--slow-input-ms", type=float, default=0.0)
    p.add_argument("--hang-at-step", type=int, default=-1)
    p.add_argument("--hang-kernel-at-step", type=int, default=-1)
    p.add_argument("--hang-kernel-s", type=float, default=60.0)
    p.add_argument("--loader", action="store_true")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--fsdp2", action="store_true")
    args = p.parse_args()
    gpu = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()) if gpu else None
    device = device or torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    slow = rank == args.slow_rank
    vocab, d, seq, batch = (8192, args.width, 256, args.batch) if gpu else (512, 64, 32, 8)
    dtype = torch.bfloat16 if gpu else torch.float32
    side = 4096 if gpu else 256
    extra = Extra(matmuls_for(args.slow_gpu_ms if slow else 0.0, device, side, dtype), side)
    gpt = Gpt(vocab, d, args.layers, extra).to(device)
    model: nn.Module
    if args.fsdp2:
        from torch.distributed.fsdp import fully_shard

        for block in gpt.blocks.layers:
            fully_shard(block)
        fully_shard(gpt)
        model = gpt  # fully_shard makes the module itself the sharded one
    else:
        model = nn.parallel.DistributedDataParallel(gpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, vocab, (200_000,), generator=torch.Generator().manual_seed(1))
    data = tokens.to(device)
    slow_s = args.slow_input_ms / 1000 if slow else 0.0

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - seq - 1, (batch,), device=device)
        offsets = ix[:, None] + torch.arange(seq, device=device)
        if slow_s:
            time.sleep(slow_s)
        return data[offsets], data[offsets + 1]

    batches = iter(loader(tokens, seq, batch, slow_s)) if args.loader else None
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    times: list[float] = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        if slow and step == args.hang_at_step:
            time.sleep(3600)  # a hang in the rank's own Python code
        if slow and step == args.hang_kernel_at_step:
            gpt.spin.cycles = int(args.hang_kernel_s * torch.cuda.clock_rate() * 1e6)  # clock_rate: MHz
        if step == args.warmup:
            sync()
            window_start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for micro in range(args.accumulation):
            if batches is not None:
                x, y = (t.to(device, non_blocking=True) for t in next(batches))
            else:
                x, y = get_batch()
            last = micro == args.accumulation - 1
            ddp = model if isinstance(model, nn.parallel.DistributedDataParallel) else None
            with ddp.no_sync() if ddp is not None and not last else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=dtype, enabled=gpu):
                    logits = model(x)
                    loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
                (loss / args.accumulation).backward()
        opt.step()
        loss_value = loss.item()  # the host waits for the GPU here, as most training loops do
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
    tail = times[20:] or times
    print(f"rank {rank}: median step {1000 * statistics.median(tail):.2f} ms, loss {loss_value:.3f}", flush=True)
    if args.steps > args.warmup:
        sync()
        mean_ms = 1000 * (time.perf_counter() - window_start) / (args.steps - args.warmup)
        print(f"rank {rank}: mean step {mean_ms:.3f} ms over {args.steps - args.warmup} steps", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
