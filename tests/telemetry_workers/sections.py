"""A gloo worker with the two-line API: data / compute / sync sections and telemetry.step().

Shaped like a GPU training seen from the host: a little CPU work per step, the rest waiting for the
"device" (sleeps), so four ranks fit on two cores. ``--slow-rank R --slow-phase input|compute
--slow-ms M`` makes rank R slower by M ms per step in that phase; ``--slow-pct P`` instead by P % of
the job's pace as measured in this run (rank R's own step less what it added, the median of its last
20 steps, from step 10): a slowdown of P % however the host's load moves the step;
``--slow-from-step K``: only from step K on (a slowdown that starts mid-run). Runs under torchrun or
plain python.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections import deque

import torch
import torch.distributed as dist
from clean_exit import leave

from openclaw_launch import telemetry


def busy(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-phase", choices=("input", "compute"), default="input")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-pct", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=0)
    p.add_argument("--ready-file", help="Written once 20 steps are done (tests wait for it).")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slowed = rank == args.slow_rank
    extra = 0.0
    paces: deque[float] = deque(maxlen=20)  # ms per step without what this rank added
    grad = torch.zeros(1024)
    for step in range(args.steps):
        started = time.perf_counter()
        if slowed and step >= args.slow_from_step:
            extra = args.slow_ms
            if args.slow_pct and len(paces) >= 10:
                extra = args.slow_pct / 100 * statistics.median(paces)
        if args.ready_file and step == 20:
            with open(args.ready_file.format(rank=rank), "w") as ready:
                ready.write("ready")
        with telemetry.section("data"):
            time.sleep((0.3 * args.step_ms + (extra if args.slow_phase == "input" else 0.0)) / 1000)
        with telemetry.section("compute"):
            busy(0.05 * args.step_ms)  # launching the work
            time.sleep((0.65 * args.step_ms + (extra if args.slow_phase == "compute" else 0.0)) / 1000)
        with telemetry.section("sync"):
            dist.all_reduce(grad)
        telemetry.step()
        paces.append(1000 * (time.perf_counter() - started) - extra)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done, {os.environ.get('OPENCLAW_TELEMETRY_SOCKET') is not None}")


if __name__ == "__main__":
    main()
    leave()
