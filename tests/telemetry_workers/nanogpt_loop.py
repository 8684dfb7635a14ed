"""A nanoGPT/minGPT-style DDP training on gloo with no openclaw code: batches sliced from a token
tensor inside the loop (``get_batch``), or, with ``--loader``, drawn from a DataLoader.

``--slow-rank R --slow-ms M`` makes rank R slower by M ms per step in its batch preparation (a sleep
in ``get_batch`` or in the DataLoader's collate), from step ``--slow-from-step`` on.
``--claim-backend nccl`` sets OPENCLAW_BACKEND=nccl before torch is imported, as on a GPU host whose
plan says NCCL while the script makes a gloo group. ``--compute-ms`` adds a sleep to rank
``--slow-rank``'s forward (a compute straggler) instead. ``--accum N``: N micro-batches per optimizer
step, the first N-1 under DDP's ``no_sync`` (gradient accumulation); ``--fetch-between``: the next
batch is fetched between the forward and the backward, as karpathy/nanoGPT's ``train.py`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

from clean_exit import leave


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    p.add_argument("--compute-ms", type=float, default=0.0)
    p.add_argument("--step-sleep-ms", type=float, default=10.0, help="every rank's device-like wait in forward")
    p.add_argument("--loader", action="store_true")
    p.add_argument("--claim-backend")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (DDP no_sync)")
    p.add_argument(
        "--fetch-between", action="store_true", help="nanoGPT's order: the next batch between forward and backward"
    )
    args = p.parse_args()
    if args.claim_backend:
        os.environ["OPENCLAW_BACKEND"] = args.claim_backend

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    vocab, block, batch = 64, 16, 8
    data = torch.randint(0, vocab, (20_000,), generator=torch.Generator().manual_seed(1))
    state = {"step": 0}

    def slow_now() -> float:
        if rank == args.slow_rank and state["step"] >= args.slow_from_step:
            return args.slow_ms / 1000
        return 0.0

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - block - 1, (batch,))
        x = torch.stack([data[i : i + block] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
        if slow_now():
            time.sleep(slow_now())
        return x, y

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, 32)
            self.head = nn.Linear(32, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            extra = args.compute_ms / 1000 if rank == args.slow_rank else 0.0
            time.sleep(args.step_sleep_ms / 1000 + extra)
            return self.head(self.emb(x))

    model = DistributedDataParallel(Tiny())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    if args.loader:

        class Windows(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
            def __len__(self) -> int:
                return 10**6

            def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
                j = i % (len(data) - block - 1)
                return data[j : j + block], data[j + 1 : j + 1 + block]

        def collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
            if slow_now():
                time.sleep(slow_now())
            xs, ys = zip(*items, strict=True)
            return torch.stack(xs), torch.stack(ys)

        batches = iter(torch.utils.data.DataLoader(Windows(), batch_size=batch, shuffle=True, collate_fn=collate))
        next_batch = lambda: next(batches)  # noqa: E731
    else:
        next_batch = get_batch

    x, y = next_batch()
    for step in range(args.steps):
        state["step"] = step
        for micro in range(args.accum):
            if not args.fetch_between:
                x, y = next_batch()
            sync = micro == args.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                logits = model(x)
                loss = nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1)) / args.accum
                if args.fetch_between:  # as karpathy/nanoGPT's train.py: prefetch before the backward
                    x, y = next_batch()
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done")


if __name__ == "__main__":
    main()
    leave()
