"""The trivial worker of benchmarks/scale.py: no imports beyond the standard library, so the
numbers are the launchers' and not the workers'.

It writes ``DIR/ready-RANK-ATTEMPT`` (the attempt from TORCHELASTIC_RESTART_COUNT), then waits
for ``DIR/go-ATTEMPT``. If ``--fail-rank`` is its rank in attempt ``--fail-attempt`` (0 unless
told), it then exits 3 (one node's failure); every other rank waits for ``DIR/stop`` and exits 0.

With ``--step-s S`` (the ``phases`` scenario) it steps after ``go`` instead of waiting: a sleep of
S in a ``compute`` section, then ``telemetry.step()`` (openclaw_launch.telemetry, which loads
nothing beyond the standard library), until ``DIR/stop``. Rank ``--slow-rank`` sleeps
``--slow-s`` more per step once ``DIR/slow`` exists, and writes the time its first slow step began
to ``DIR/slowed``. A stepping worker writes the time it leaves to ``DIR/exit-RANK``.
"""

from __future__ import annotations

import argparse
import os
import time


def write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def step_until_stop(directory: str, rank: int, args: argparse.Namespace) -> None:
    from openclaw_launch import telemetry

    slow, stop = os.path.join(directory, "slow"), os.path.join(directory, "stop")
    slow_since = None
    while not os.path.exists(stop):
        extra = 0.0
        if rank == args.slow_rank and (slow_since is not None or os.path.exists(slow)):
            if slow_since is None:
                slow_since = time.time()
                write(os.path.join(directory, "slowed"), f"{slow_since}\n")
            extra = args.slow_s
        with telemetry.section("compute"):
            time.sleep(args.step_s + extra)
        telemetry.step()
    write(os.path.join(directory, f"exit-{rank}"), f"{time.time()}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-attempt", type=int, default=0)
    p.add_argument("--step-s", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-s", type=float, default=0.0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    write(os.path.join(args.directory, f"ready-{rank}-{attempt}"), f"{time.time()} {os.environ.get('WORLD_SIZE')}\n")
    go = os.path.join(args.directory, f"go-{attempt}")
    stop = os.path.join(args.directory, "stop")
    while not os.path.exists(go) and not os.path.exists(stop):
        time.sleep(0.05)
    if args.step_s > 0:
        step_until_stop(args.directory, rank, args)
        return
    if rank == args.fail_rank and attempt == args.fail_attempt:
        raise SystemExit(3)
    while not os.path.exists(stop):
        time.sleep(0.1)


if __name__ == "__main__":
    main()
