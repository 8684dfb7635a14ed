"""A gloo worker that hangs on purpose (tests/test_hang.py).

Every step: a little "compute", an all-reduce (a zero-code hooked collective), ``telemetry.step()``.
After ``--at`` steps, rank ``--rank`` stops:

- ``sleep``: sleeps forever in a pure-Python loop; the others block in their next all-reduce.
- ``read``: blocks in a C call, ``os.read`` on a pipe nobody writes; the others block as above.
- ``barrier``: enters a barrier nobody else enters; the others wait in a ``sync`` section.
- ``pause``: blocks in libc's ``pause()`` through ctypes (a C call, no Python progress).

``--first-step`` marks one more boundary (a step of its own) before the loop;
``--init-sleep-s`` makes rank ``--rank`` sleep before ``init_process_group`` (a start-up hang).
- ``slow``: no hang: that rank is ``--slow-ms`` slower per step (a straggler), to the end.

Each blocking line carries a ``# BLOCKS-HERE <mode>`` marker the test looks for in the stacks.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
from clean_exit import leave

from openclaw_launch import telemetry


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("sleep", "read", "barrier", "pause", "slow", "none"), default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-ms", type=float, default=30.0)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--marker", default="")  # lets the test find leftover processes
    p.add_argument("--first-step", action="store_true")
    p.add_argument("--init-sleep-s", type=float, default=0.0)
    args = p.parse_args()
    if args.init_sleep_s and int(os.environ["RANK"]) == args.rank:
        time.sleep(args.init_sleep_s)  # BLOCKS-HERE init
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grad = torch.zeros(64)
    if args.first_step:
        telemetry.step()
    for step in range(args.steps):
        if step == args.at and args.mode in ("sleep", "read", "barrier", "pause"):
            if rank == args.rank:
                print(f"HANGING {time.time():.3f}", flush=True)
                if args.mode == "sleep":
                    while True:
                        time.sleep(0.05)  # BLOCKS-HERE sleep
                elif args.mode == "pause":
                    import ctypes

                    while True:  # the stack-dump signal ends a pause(): pause again
                        ctypes.CDLL(None).pause()  # BLOCKS-HERE pause
                elif args.mode == "read":
                    r, _w = os.pipe()
                    os.read(r, 1)  # BLOCKS-HERE read
                else:
                    dist.barrier()  # BLOCKS-HERE barrier
            elif args.mode == "barrier":
                with telemetry.section("sync"):
                    threading.Event().wait()  # BLOCKS-HERE waiting
        with telemetry.section("compute"):
            time.sleep((args.step_ms + (args.slow_ms if rank == args.rank and args.mode == "slow" else 0)) / 1000)
        dist.all_reduce(grad)
        telemetry.step()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done", file=sys.stderr)


if __name__ == "__main__":
    main()
    leave()
