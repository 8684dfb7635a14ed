"""A worker that opens torchrun's agent store as a client before its process group, as torchft's
Manager does: ``TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)``, then ``init_process_group``
(env://). Each attempt's ranks say whether their keys of the attempt before are still in the store
(under torchrun they are: one store for the job's life). ``--fail-first``: rank 1 of attempt 0
exits 3 once its group has formed."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch.distributed as dist

store = dist.TCPStore(
    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
)
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), int(os.environ["RANK"])
store.set(f"seen/{attempt}/{rank}", b"1")
kept = attempt > 0 and store.check([f"seen/{attempt - 1}/{rank}"])
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
dist.barrier()
agent_store = os.environ["TORCHELASTIC_USE_AGENT_STORE"]
sys.stdout.write(f"rank {rank} attempt {attempt} agent-store {agent_store} earlier-keys {kept}\n")  # one write: the
sys.stdout.flush()  # ranks share torchrun's stdout, and print's two writes interleave there
code = 3 if "--fail-first" in sys.argv and attempt == 0 and rank == 1 else 0
if code == 0:
    dist.barrier()
sys.stdout.flush()
os._exit(code)  # before torch's C++ teardown, which can abort a finished gloo rank
