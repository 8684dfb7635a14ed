"""The start-up window in which a stopping signal is not the launcher's (issue 32, item 9).

Two measures, for each command given (``--cmd NAME=COMMAND``, run by ``shlex.split``):

- ``handler``: the time from ``Popen`` to the moment the process catches SIGTERM, polled in
  ``/proc/PID/status`` (``SigCgt``). Before that a SIGTERM ends a process by the kernel's default
  (or, as a container's PID 1, is dropped), and a SIGINT either does the same or, once the
  interpreter's own handler is in, raises ``KeyboardInterrupt`` (a traceback, exit 1).
- ``sweep`` (``--sweep N``): N runs of each command, each given a SIGINT at a random time in [0, 2 x
  the slowest command's handler median]; each outcome counted: ``line`` (exit 130, no traceback:
  the launcher's), ``killed`` (ended by the signal itself, before Python handled it: a shell shows
  130, no traceback), ``traceback`` (Python's own: the window this item is about), ``other`` (the job's
  own stop once it runs: 130 after its summary lines; the floor's handler; as PID 1 also a dropped
  signal: the command ran its course).

The commands take turns, run by run. ``--load N`` runs N busy processes meanwhile (a loaded host,
as the PID 1 finding's 0.15 s).
``--pid1`` runs each command as PID 1 of a new PID namespace (``unshare --pid --fork``; root).

    python benchmarks/signal_window.py --reps 30 --sweep 40 --pid1 --load 2 \\
      --cmd floor-S='python3 -S -c "import _signal,time; _signal.signal(15, print); time.sleep(1)"' \\
      --cmd script='openclaw-launch --nproc-per-node 1 --no-python sleep 1' \\
      --cmd dash-S='python3 -S .../openclaw_launch/__main__.py --nproc-per-node 1 --no-python sleep 1'

(benchmarks/RESULTS.md has the commands as run.)
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
    prefix = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"] if pid1 else []
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
        commands = {name: shlex.split(command) for name, _, command in (c.partition("=") for c in args.cmd)}
        found: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.reps):  # interleaved: the host's load falls on every command alike
            for name, argv in commands.items():
                h = handler_s(argv, args.pid1)
                if h is not None:
                    found[name].append(h)
        for name, times in found.items():
            if not times:
                print(f"{name}: never caught SIGTERM")
                continue
            times.sort()
            p90 = times[int(0.9 * (len(times) - 1))]
            print(
                f"{name}: SIGTERM caught after Popen, ms: median {statistics.median(times) * 1e3:.1f}, "
                f"p90 {p90 * 1e3:.1f}, min {times[0] * 1e3:.1f}, max {times[-1] * 1e3:.1f} "
                f"({len(times)} of {args.reps})"
            )
        if args.sweep:
            horizon_s = 2 * max(statistics.median(t) for t in found.values() if t)
            counts: dict[str, dict[str, int]] = {name: {} for name in commands}
            late: dict[str, dict[str, float]] = {name: {} for name in commands}
            for _ in range(args.sweep):
                for name, argv in commands.items():
                    delay = random.uniform(0.0, horizon_s)
                    kind = outcome(argv, args.pid1, delay)
                    counts[name][kind] = counts[name].get(kind, 0) + 1
                    late[name][kind] = max(late[name].get(kind, 0.0), delay)
            for name in commands:
                shown = ", ".join(
                    f"{k} {n} (latest at {late[name][k] * 1e3:.1f} ms)" for k, n in sorted(counts[name].items())
                )
                print(f"{name}: SIGINT at random in [0, {horizon_s * 1e3:.0f}] ms: {shown}")
    finally:
        for b in burners:
            b.terminate()


if __name__ == "__main__":
    main()
