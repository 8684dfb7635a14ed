"""torchft's train_ddp.py (its README's one-replica-group line) cut to what the launcher is tested
on: a Manager (which opens the agent store, ``TCPStore(MASTER_ADDR, MASTER_PORT, is_master=False)``,
and asks the lighthouse at ``TORCHFT_LIGHTHOUSE`` for a quorum every step), torchft's DDP and
Optimizer over gloo on CPU, synthetic batches instead of CIFAR-10. ``--steps N`` steps (default 3),
then ``torchft steps N`` on stdout."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo


def main() -> int:
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
    replica_group = int(os.environ.get("REPLICA_GROUP_ID", 0))
    model = nn.Linear(8, 2)
    optimizer: optim.Optimizer | None = None

    def state_dict() -> dict[str, object]:
        assert optimizer is not None
        return {"model": model.state_dict(), "optim": optimizer.state_dict()}

    def load_state_dict(state: dict[str, object]) -> None:
        assert optimizer is not None
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        optimizer.load_state_dict(state["optim"])  # type: ignore[arg-type]

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=30)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{replica_group}",
        timeout=timedelta(seconds=30),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optim.AdamW(ddp.parameters()))
    torch.manual_seed(0)
    while manager.current_step() < steps:
        inputs, labels = torch.randn(16, 8), torch.randint(0, 2, (16,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(inputs), labels).backward()
        optimizer.step()
    sys.stdout.write(f"torchft steps {manager.current_step()}\n")
    sys.stdout.flush()
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # torchft's and gloo's threads: no C++ teardown to abort in
