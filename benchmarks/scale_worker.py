"""The trivial worker of benchmarks/scale.py: no imports beyond the standard library, so the
numbers are the launchers' and not the workers'.

It writes ``DIR/ready-RANK-ATTEMPT`` (the attempt from TORCHELASTIC_RESTART_COUNT), then waits
for ``DIR/go-ATTEMPT``. If ``--fail-rank`` is its rank in attempt ``--fail-attempt`` (0 unless
told), it then exits 3 (one node's failure); every other rank waits for ``DIR/stop`` and exits 0.
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("directory")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-attempt", type=int, default=0)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ready = os.path.join(args.directory, f"ready-{rank}-{attempt}")
    with open(ready + ".tmp", "w") as f:
        f.write(f"{time.time()} {os.environ.get('WORLD_SIZE')}\n")
    os.replace(ready + ".tmp", ready)
    go = os.path.join(args.directory, f"go-{attempt}")
    stop = os.path.join(args.directory, "stop")
    while not os.path.exists(go) and not os.path.exists(stop):
        time.sleep(0.05)
    if rank == args.fail_rank and attempt == args.fail_attempt:
        raise SystemExit(3)
    while not os.path.exists(stop):
        time.sleep(0.1)


if __name__ == "__main__":
    main()
