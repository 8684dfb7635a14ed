"""An elastic job's rank that checkpoints (tests/test_straggler_exclude.py, benchmarks/straggler_exclude.py):
it joins the gloo world from torchrun's variables, resumes at the step its checkpoint file holds (``--ckpt``,
one file for the job: rank 0 writes it), and all-reduces once per step (``telemetry.step()``; the sleep
before it is the step's ``data`` section) until ``--steps`` steps are done. SIGUSR1 (the launcher's
checkpoint request) makes rank 0 write the step it finished at the next step boundary.

A node whose launcher has ``STRAGGLE_MS`` in its environment sleeps that long more in each step's
``data`` section from step ``STRAGGLE_FROM`` (default 0) until step ``STRAGGLE_UNTIL`` (default: for
ever): the slowness is the node's, not a rank's, so the node that takes its rank is not slow.

Prints ``world ... resumed S`` when it joined, ``checkpoint S`` per checkpoint, ``step S at T restart R``
every ``--say-every`` steps (rank 0: the benchmark's pace), and ``done S`` at the end. Leaves with os._exit
(tests/allreduce_worker.py says why).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from openclaw_launch import telemetry

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--step-s", type=float, default=0.02)
parser.add_argument("--ckpt", required=True)
parser.add_argument("--say-every", type=int, default=0)
args = parser.parse_args()

slow_s = float(os.environ.get("STRAGGLE_MS", "0")) / 1000
slow_from = int(os.environ.get("STRAGGLE_FROM", "0"))
slow_until = int(os.environ.get("STRAGGLE_UNTIL", str(1 << 30)))
asked = []
signal.signal(signal.SIGUSR1, lambda sig, frame: asked.append(sig))

dist.init_process_group("gloo")
rank = dist.get_rank()
step = int(Path(args.ckpt).read_text()) if os.path.exists(args.ckpt) else 0
print(
    f"world rank {rank} size {dist.get_world_size()} restart {os.environ['TORCHELASTIC_RESTART_COUNT']} resumed {step}",
    flush=True,
)


def checkpoint(done: int) -> None:
    tmp = f"{args.ckpt}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(str(done))
    os.replace(tmp, args.ckpt)
    print(f"checkpoint {done}", flush=True)


while step < args.steps:
    with telemetry.section("data"):
        time.sleep(args.step_s + (slow_s if slow_from <= step < slow_until else 0.0))
    dist.all_reduce(torch.tensor([1.0]))
    step += 1
    telemetry.step()
    if asked and rank == 0:
        asked.clear()
        checkpoint(step)
    if args.say_every and rank == 0 and step % args.say_every == 0:
        print(f"step {step} at {time.time():.3f} restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
dist.barrier()
if rank == 0:
    checkpoint(step)
print(f"done {step}", flush=True)
sys.stdout.flush()
os._exit(0)
