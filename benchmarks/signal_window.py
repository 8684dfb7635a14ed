"""The start-up window in which a stopping signal is not the launcher's (issue 32, item 9).

Two measures, for each command given (``--cmd NAME=COMMAND``, run by ``shlex.split``):

- ``handler``: the time from ``Popen`` to the moment the process catches SIGTERM, polled in
  ``/proc/PID/status`` (``SigCgt``). Before that a SIGTERM ends a process by the kernel's default
  (or, as a container's PID 1, is dropped), and a SIGINT either does the same or, once the
  interpreter's own handler is in, raises ``KeyboardInterrupt`` (a traceback, exit 1).
- ``sweep`` (``--sweep N``): N runs each given a SIGINT at a random time in [0, 2 x the handler's
  median]; each outcome counted: ``line`` (exit 130, no traceback: the launcher's), ``killed``
  (ended by the signal itself, before Python handled it: a shell shows 130, no traceback),
  ``traceback`` (Python's own: the window this item is about), ``other``.

``--load N`` runs N busy processes meanwhile (a loaded host, as the PID 1 finding's 0.15 s).
``--pid1`` runs each command as PID 1 of a new PID namespace (``unshare --pid --fork``; root).

    python benchmarks/signal_window.py --reps 30 --sweep 60 --load 2 \\
      --cmd floor-S='python3 -S -c "import _signal,time; _signal.signal(15, print); time.sleep(2)"' \\
      --cmd floor='python3 -c "import _signal,time; _signal.signal(15, print); time.sleep(2)"' \\
      --cmd script='openclaw-launch --nproc-per-node 1 --no-python sleep 2' \\
      --cmd module='python3 -m openclaw_launch --nproc-per-node 1 --no-python sleep 2'
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shlex
import signal
import statistics
import subprocess
import time
from pathlib import Path

_SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def _target(proc: subprocess.Popen[bytes], pid1: bool) -> int | None:
    """The process to watch: the command itself, or unshare's first child as PID 1."""
    if not pid1:
        return proc.pid
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _catches_sigterm(pid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & _SIGTERM_BIT)
    except OSError:
        pass
    return False


def _start(argv: list[str], pid1: bool) -> subprocess.Popen[bytes]:
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"] if pid1 else []
    return subprocess.Popen(prefix + argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def handler_s(argv: list[str], pid1: bool) -> float | None:
    """Popen -> SIGTERM caught, or None when the process ended first."""
    start = time.monotonic()
    proc = _start(argv, pid1)
    try:
        while proc.poll() is None:
            pid = _target(proc, pid1)
            if pid is not None and _catches_sigterm(pid):
                return time.monotonic() - start
        return None
    finally:
        proc.kill()
        proc.communicate()


def outcome(argv: list[str], pid1: bool, delay_s: float) -> str:
    proc = _start(argv, pid1)
    time.sleep(delay_s)
    target = _target(proc, pid1) if pid1 else proc.pid
    if target is not None:
        os.kill(target, signal.SIGINT)
    _, err = proc.communicate()
    if b"Traceback" in err or b"KeyboardInterrupt" in err:
        return "traceback"
    if proc.returncode == 128 + signal.SIGINT:
        return "line" if err.count(b"\n") <= 3 else "other"
    return "killed" if proc.returncode == -signal.SIGINT else "other"


def _burn() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cmd", action="append", required=True, help="NAME=COMMAND")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--sweep", type=int, default=0)
    parser.add_argument("--load", type=int, default=0)
    parser.add_argument("--pid1", action="store_true")
    args = parser.parse_args()
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    try:
        print(f"load {args.load} busy processes; pid1 {args.pid1}; {os.cpu_count()} CPUs")
        for spec in args.cmd:
            name, _, command = spec.partition("=")
            argv = shlex.split(command)
            found = [h for h in (handler_s(argv, args.pid1) for _ in range(args.reps)) if h is not None]
            if not found:
                print(f"{name}: never caught SIGTERM")
                continue
            found.sort()
            median = statistics.median(found)
            p90 = found[int(0.9 * (len(found) - 1))]
            print(
                f"{name}: SIGTERM caught after Popen, ms: median {median * 1e3:.1f}, p90 {p90 * 1e3:.1f}, "
                f"min {found[0] * 1e3:.1f}, max {found[-1] * 1e3:.1f} ({len(found)} of {args.reps})"
            )
            if args.sweep:
                counts: dict[str, int] = {}
                late: dict[str, float] = {}
                for _ in range(args.sweep):
                    delay = random.uniform(0.0, 2 * median)
                    kind = outcome(argv, args.pid1, delay)
                    counts[kind] = counts.get(kind, 0) + 1
                    late[kind] = max(late.get(kind, 0.0), delay)
                shown = ", ".join(f"{k} {n} (latest at {late[k] * 1e3:.1f} ms)" for k, n in sorted(counts.items()))
                print(f"{name}: SIGINT at random in [0, {2 * median * 1e3:.0f}] ms: {shown}")
    finally:
        for b in burners:
            b.terminate()


if __name__ == "__main__":
    main()
