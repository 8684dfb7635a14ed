"""torchft's DDP example (train_ddp.py) in the shape ``--replica-groups`` runs it: a Manager per
replica group (``replica_id`` from REPLICA_GROUP_ID, the lighthouse from TORCHFT_LIGHTHOUSE, the
store at the group's MASTER_PORT), torchft's DDP and Optimizer over gloo on CPU, synthetic batches.
DDP is torchft's PureDistributedDataParallel (its allreduce per gradient, waited in should_commit):
torchft 0.2.0's DistributedDataParallel waits in its comm hook and asserts (ddp.py ``assert
fut._fut``) when the peer group dies during that allreduce, so the surviving group crashed too
(and was restarted by its own launcher) in about half of the kills on the 2-core box. Every
replica's weights start from one seed, with ``init_sync=False`` (torchft's docstring's advice for
that case): no heal at step 0, whose HTTP fetch from group 0 loses the race with group 0's next
``should_commit`` on this tiny model and stalled the first steps 10 s (benchmarks/RESULTS.md).

For the tests and benchmarks/replica_groups.py: ``--mark-dir D`` writes D/pid-gG-rR-aA (its pid,
once), D/lighthouse (TORCHFT_LIGHTHOUSE), and after every committed step D/step-gG-rR (``STEP
MONOTONIC_TIME ATTEMPT``, replaced atomically) and a line of the same in D/steps-gG-rR.log, and
after every step torchft discarded (its allreduce or quorum failed: not committed) a line of the
same in D/discarded-gG-rR.log. It steps
every ``--step-s`` seconds until the step D/stop names (or ``--steps N``) is made, then prints
``torchft group G steps N`` and exits 0: every group ends after the same step, none is left in a
step whose peer is gone. ``--fail-group G``: group G's ranks exit 3 at once."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn, optim
from torchft import Manager, Optimizer, ProcessGroupGloo
from torchft.ddp import PureDistributedDataParallel


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def _stop_step(marks: Path) -> int:
    try:
        return int((marks / "stop").read_text())
    except (OSError, ValueError):  # not there yet (or being written)
        return sys.maxsize


def main() -> int:
    marks = Path(_arg("--mark-dir", "."))
    max_steps = int(_arg("--steps", "1000000"))
    step_s = float(_arg("--step-s", "0.05"))
    group, rank = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["RANK"])
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    (marks / f"pid-g{group}-r{rank}-a{attempt}").write_text(str(os.getpid()))
    (marks / "lighthouse").write_text(os.environ["TORCHFT_LIGHTHOUSE"])
    if _arg("--fail-group", "") == str(group):  # a group that cannot start: its launcher's restarts are spent
        return 3
    torch.manual_seed(0)  # the same weights in every replica group: init_sync=False below
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
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_ddp_{group}",
        timeout=timedelta(seconds=10),
        init_sync=False,
    )
    ddp = PureDistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, optim.AdamW(ddp.parameters()))
    step_file, tmp = marks / f"step-g{group}-r{rank}", marks / f".step-g{group}-r{rank}"
    log = (marks / f"steps-g{group}-r{rank}.log").open("a", buffering=1)
    discarded = (marks / f"discarded-g{group}-r{rank}.log").open("a", buffering=1)
    while manager.current_step() < min(max_steps, _stop_step(marks)):
        inputs, labels = torch.randn(16, 8), torch.randint(0, 2, (16,))
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(inputs), labels).backward()
        before = manager.current_step()
        optimizer.step()
        if manager.current_step() > before:  # committed (torchft's should_commit)
            mark = f"{manager.current_step()} {time.monotonic()} {attempt}"
            tmp.write_text(mark)
            tmp.replace(step_file)
            log.write(mark + "\n")
        else:
            discarded.write(f"{before + 1} {time.monotonic()} {attempt}\n")
        time.sleep(step_s)
    sys.stdout.write(f"torchft group {group} steps {manager.current_step()}\n")
    sys.stdout.flush()
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)  # torchft's and gloo's threads: no C++ teardown to abort in
