#!/usr/bin/env python3
"""What joining a job cgroup costs on this host (run/cgroup.py's probe and each worker's join).

Moving a process into a cgroup takes the kernel's cgroup_threadgroup_rwsem for writing, which can
wait for an RCU grace period (milliseconds to tens of them in a VM); back-to-back moves share one.
This times, in a child of the launcher's own cgroup (as run/cgroup.py makes it), ``--reps`` times:
a plain fork + exit + wait; a fork whose child writes ``cgroup.procs`` (the probe); two such
children back to back; and ``cgroup.create`` as the launcher calls it. Medians, milliseconds.

    cgroup_cost.py --reps 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from openclaw_launch.run import cgroup


def _fork_join(procs: str | None) -> float:
    """Fork a child that joins ``procs`` (None: joins nothing) and exits; seconds until reaped."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        if procs is not None:
            cgroup.join(procs)
        os._exit(0)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args(argv)
    info, own = cgroup._read(cgroup.MOUNTINFO), cgroup._read(cgroup.PROC_CGROUP)
    root = cgroup.own_cgroup_dir(info or "", own or "")
    print(f"own cgroup dir: {root}; {os.cpu_count()} cpus; {sys.version.split()[0]}")
    if root is None:
        return 1
    path = os.path.join(root, f"cgroup-cost-{os.getpid()}")
    os.mkdir(path)
    procs = os.path.join(path, "cgroup.procs")
    rows: dict[str, list[float]] = {"fork+exit+wait": [], "fork+join+exit+wait": [], "two joins back to back": []}
    creates: list[float] = []
    try:
        for _ in range(a.reps):
            rows["fork+exit+wait"].append(_fork_join(None))
            time.sleep(0.05)  # let the previous move's grace period end: the start path's case
            rows["fork+join+exit+wait"].append(_fork_join(procs))
            time.sleep(0.05)
            rows["two joins back to back"].append(_fork_join(procs) + _fork_join(procs))
            time.sleep(0.05)
            t0 = time.perf_counter()
            job = cgroup.create(f"cgroup-cost-create-{os.getpid()}")
            creates.append(time.perf_counter() - t0)
            if job is not None:
                job.remove()
            time.sleep(0.05)
    finally:
        os.rmdir(path)
    rows["cgroup.create (mkdir + probe)"] = creates
    for name, values in rows.items():
        ms = sorted(1000 * v for v in values)
        print(f"  {statistics.median(ms):8.2f} ms median  (min {ms[0]:.2f}, max {ms[-1]:.2f})  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
