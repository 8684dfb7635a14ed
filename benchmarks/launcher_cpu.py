#!/usr/bin/env python3
"""The launcher's own CPU time on its start and clean-exit paths: steadier than wall times on a
shared box, where the load delays the clock but not the work.

Runs ``python -m openclaw_launch --nproc-per-node N --no-python true`` ``--reps`` times in a wrapper
that records ``time.process_time()`` (user + system of the launcher, not its children) at its last
worker spawn (the ``subprocess.Popen`` audit event), at the reap of its last worker
(``RealOs.reap``) and at exit. The wrapper imports nothing the launcher would not import there.
Medians, milliseconds. Use ``PYTHONPATH`` to choose the tree.

    launcher_cpu.py --nprocs 2,4,8 --reps 9
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

WRAPPER = r"""
import atexit, json, sys, time
marks = {"spawns": 0}
def hook(event, args):
    if event == "subprocess.Popen":
        marks["spawns"] += 1
        marks["last_spawn"] = time.process_time()
sys.addaudithook(hook)
from openclaw_launch.run import osproc
_reap = osproc.RealOs.reap
def reap(self):
    out = _reap(self)
    if out:
        marks["last_reap"] = time.process_time()
    return out
osproc.RealOs.reap = reap
def report():
    sys.__stderr__.write("LAUNCHER_CPU " + json.dumps(dict(marks, exit=time.process_time())) + "\n")
atexit.register(report)
sys.argv = ["openclaw-launch", "--nproc-per-node", sys.argv[1], "--no-python", "true"]
from openclaw_launch.__main__ import main
main()
"""


def one(nproc: int) -> dict[str, float]:
    err = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(nproc)], capture_output=True, text=True, timeout=60, check=False
    ).stderr
    line = next(x for x in err.splitlines() if x.startswith("LAUNCHER_CPU "))
    marks: dict[str, float] = json.loads(line.split(" ", 1)[1])
    return {
        "to last spawn": marks["last_spawn"],
        "last reap to exit": marks["exit"] - marks["last_reap"],
        "whole run": marks["exit"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", default="2,4,8")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args(argv)
    for n in (int(x) for x in a.nprocs.split(",")):
        one(n)  # warm-up
        runs = [one(n) for _ in range(a.reps)]
        cols = "  ".join(f"{k} {1000 * statistics.median(r[k] for r in runs):6.1f}" for k in runs[0])
        print(f"N={n}: launcher CPU ms (median of {a.reps}): {cols}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
