"""A worker that steps on its own (``telemetry.step()``, no collective, no torch), for the
attempt-contract tests (tests/test_hang.py, tests/test_agents_loopback.py): the ranks of one node
keep stepping while a rank of another node hangs, as in issue 16's two-node cases.

- ``--hang-rank R --hang-at N``: rank R stops stepping after N steps (a pure-Python sleep loop),
  in the attempts listed by ``--hang-attempts`` (default: every attempt); it first writes
  ``--hung-file`` (``{attempt}`` is replaced), so a test knows when it hung.
- ``--exit-rank R --exit-code C``: rank R exits C, in the attempts of ``--exit-attempts``, after
  N steps (``--exit-at``), or ``--exit-after-hung-s`` seconds after ``--hung-file`` appeared.
- otherwise a rank steps ``--steps`` times (0: until stopped) and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from openclaw_launch import telemetry


def _ints(text: str) -> set[int]:
    return {int(x) for x in text.split(",") if x}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-at", type=int, default=5)
    p.add_argument("--hang-attempts", type=_ints, default=None)
    p.add_argument("--hung-file", default="")
    p.add_argument("--exit-rank", type=int, default=-1)
    p.add_argument("--exit-code", type=int, default=7)
    p.add_argument("--exit-attempts", type=_ints, default=None)
    p.add_argument("--exit-at", type=int, default=-1)
    p.add_argument("--exit-after-hung-s", type=float, default=-1.0)
    p.add_argument("--marker", default="")  # lets a test find leftover processes
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    hung_file = args.hung_file.format(attempt=attempt)
    hangs = rank == args.hang_rank and (args.hang_attempts is None or attempt in args.hang_attempts)
    exits = rank == args.exit_rank and (args.exit_attempts is None or attempt in args.exit_attempts)
    hung_at: float | None = None
    step = 0
    while args.steps == 0 or step < args.steps:
        if hangs and step == args.hang_at:
            print(f"HANGING rank {rank} attempt {attempt} {time.time():.3f}", flush=True)
            if hung_file:
                with open(hung_file + ".tmp", "w") as f:
                    f.write(str(rank))
                os.replace(hung_file + ".tmp", hung_file)
            while True:
                time.sleep(0.05)
        if exits and step == args.exit_at:
            sys.exit(args.exit_code)
        if exits and args.exit_after_hung_s >= 0:
            if hung_at is None and hung_file and os.path.exists(hung_file):
                hung_at = time.monotonic()
            if hung_at is not None and time.monotonic() - hung_at >= args.exit_after_hung_s:
                print(f"EXITING rank {rank} with {args.exit_code} {time.time():.3f}", flush=True)
                sys.exit(args.exit_code)
        with telemetry.section("compute"):
            time.sleep(args.step_ms / 1000)
        telemetry.step()
        step += 1


if __name__ == "__main__":
    main()
