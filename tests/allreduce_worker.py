"""A rank that joins the gloo world from torchrun's variables, all-reduces its rank and prints the sum.

It leaves with os._exit after flushing: torch's gloo teardown can abort a process at exit
("terminate called without an active exception") when a peer has already gone, which would make
a launcher test flaky for a reason that is not the launcher's.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(
    f"rank {dist.get_rank()}/{dist.get_world_size()} local {os.environ['LOCAL_RANK']} sum {int(t.item())}", flush=True
)
dist.barrier()
sys.stdout.flush()
os._exit(0)
