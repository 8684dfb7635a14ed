"""A nanoGPT-style DDP training for benchmarks/gpu/diagnosis_default.sh, with no openclaw code: a GPT
of 4 layers x 512 on a gloo group (two ranks share the one GPU under MPS), batches sliced from a
token tensor inside the loop.

``--slow-gpu-ms M``: rank ``--slow-rank`` does about M ms of extra GPU matmuls in its forward (no host
sync). ``--slow-input-ms M``: it sleeps M ms in ``get_batch`` (an in-loop input slowdown).
``--hang-at-step K``: it sleeps for an hour in its loop at step K (a hang in Python).
``--device cpu``: the same on the CPU, smaller (the script's own check on a machine without a GPU).
Prints ``rank R: median step X ms`` over the steps after the 20th.
"""

from __future__ import annotations

import argparse
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


class Gpt(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, extra: Extra) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, norm_first=True, dropout=0.0)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.extra = extra
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.extra(self.blocks(self.embed(tokens), mask=mask, is_causal=True)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-gpu-ms", type=float, default=0.0)
    p.add_argument("--slow-input-ms", type=float, default=0.0)
    p.add_argument("--hang-at-step", type=int, default=-1)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()
    gpu = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()) if gpu else None
    device = device or torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = rank == args.slow_rank
    vocab, d, seq, batch = (8192, 512, 256, 16) if gpu else (512, 64, 32, 8)
    dtype = torch.bfloat16 if gpu else torch.float32
    side = 4096 if gpu else 256
    extra = Extra(matmuls_for(args.slow_gpu_ms if slow else 0.0, device, side, dtype), side)
    model = nn.parallel.DistributedDataParallel(Gpt(vocab, d, 4, extra).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, vocab, (200_000,), generator=torch.Generator().manual_seed(1)).to(device)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - seq - 1, (batch,), device=device)
        offsets = ix[:, None] + torch.arange(seq, device=device)
        if slow and args.slow_input_ms:
            time.sleep(args.slow_input_ms / 1000)
        return data[offsets], data[offsets + 1]

    times: list[float] = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        if slow and step == args.hang_at_step:
            time.sleep(3600)  # a hang in the rank's own Python code
        x, y = get_batch()
        with torch.autocast(device.type, dtype=dtype, enabled=gpu):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = loss.item()  # the host waits for the GPU here, as most training loops do
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
    tail = times[20:] or times
    print(f"rank {rank}: median step {1000 * statistics.median(tail):.2f} ms, loss {loss_value:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
