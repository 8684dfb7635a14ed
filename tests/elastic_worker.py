"""An elastic job's rank (tests/test_elastic.py, benchmarks/elastic_reform.py): joins the gloo world
from torchrun's variables and all-reduces once per step until ``--steps`` steps are done
(``--first-steps`` in the first world: one held running until a node is killed), the world holds
``--want`` nodes (a grow test waits for the second node) and the file ``--until`` names exists.
Prints the world it runs in (``WORLD_SIZE``, nodes, ``GROUP_RANK``, ``TORCHELASTIC_RESTART_COUNT``),
when its process started (before torch is imported: where the launcher's part of a re-forming ends)
and when it joined the world, then ``done`` at the end. ``--api-steps``: each step is a step of the
launcher's statistics and hang watch (``telemetry.step()``).

Leaves with os._exit (tests/allreduce_worker.py says why).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

STARTED = time.time()

import torch  # noqa: E402 (after the start time)
import torch.distributed as dist  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--want", type=int, default=1, help="run until the world has this many nodes")
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--first-steps", type=int, help="steps in the first world (restart 0): default --steps")
parser.add_argument("--step-s", type=float, default=0.05)
parser.add_argument("--until", help="and until this file exists (a world of one rank only)")
parser.add_argument("--api-steps", action="store_true", help="telemetry.step() after each step")
args = parser.parse_args()
if args.api_steps:
    from openclaw_launch import telemetry

nodes = int(os.environ["GROUP_WORLD_SIZE"])
restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
print(
    f"world rank {dist.get_rank()} size {dist.get_world_size()} nodes {nodes} group {os.environ['GROUP_RANK']} "
    f"restart {restart} started {STARTED:.3f} at {time.time():.3f}",
    flush=True,
)
steps = args.first_steps if args.first_steps is not None and restart == "0" else args.steps
step = 0
while step < steps or nodes < args.want or (args.until and not os.path.exists(args.until)):
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    step += 1
    time.sleep(args.step_s)
    if args.api_steps:
        telemetry.step()
dist.barrier()
print(f"done rank {dist.get_rank()} size {dist.get_world_size()} restart {restart}", flush=True)
sys.stdout.flush()
os._exit(0)
