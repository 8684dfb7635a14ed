#!/usr/bin/env python3
"""Where a launcher's start time goes: exec -> the first line of a worker's user code, as a timeline.

Every Python process of the run (launcher, its helpers, the workers) loads a ``sitecustomize`` from a
temporary directory put first on PYTHONPATH; it installs an audit hook (PEP 578) that appends one line
per milestone to a file: the interpreter ready (site done), the first import of chosen modules, and
every fork, spawn and exec. The worker records its first line of user code. Each milestone's time is
taken from the harness's exec of the launcher; medians over ``--reps`` runs.

    start_timeline.py --reps 5 -- python3 -m openclaw_launch --nproc-per-node 1
    start_timeline.py --reps 5 -- torchrun --standalone --nproc-per-node 1
    start_timeline.py --reps 9 --cpu --imports openclaw_launch -- python3 -m openclaw_launch --nproc-per-node 2

``--imports PREFIX`` adds the first import of every module under PREFIX; ``--cpu`` gives each
process's own CPU seconds at its events instead of the time after exec (a shared box's load
delays the wall clock, not the work done).

The worker script is appended to the command. A ``sitecustomize`` the environment already has is
run after the hook is installed, so the processes behave as without this tool.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

MARKER_MODULES = (
    "click",
    "openclaw_launch.cli.main",
    "openclaw_launch.cli.run",
    "openclaw_launch.topology.live",
    "openclaw_launch.plan.build",
    "openclaw_launch.job.launch",
    "openclaw_launch.run.supervise",
    "openclaw_launch.telemetry.bootstrap",
    "torch",
    "pynvml",
)

SITECUSTOMIZE = """
import os as _os, sys as _sys, time as _time
_OUT = _os.environ.get("START_TIMELINE_DIR")
_MARKERS = set(@MARKERS@)
_PREFIX = _os.environ.get("START_TIMELINE_IMPORTS") or None  # --imports: every module under it too
_SEEN = set()
if _OUT:
    _fd = _os.open("%s/events.%d" % (_OUT, _os.getpid()), _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND, 0o644)
    def _put(kind, what):
        _os.write(_fd, ("%r %r %d %s %s\\n" % (_time.time(), _time.process_time(), _os.getpid(), kind, what)).encode())
    def _hook(event, args):
        if event == "import":
            if (args[0] in _MARKERS or (_PREFIX and args[0].startswith(_PREFIX))) and args[0] not in _SEEN:
                _SEEN.add(args[0])
                _put("import", args[0])
        elif event in ("os.fork", "os.forkpty"):
            _put("fork", "-")
        elif event in ("os.posix_spawn", "os.exec", "subprocess.Popen"):
            argv = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else [args[0]]
            _put(event.split(".")[-1], " ".join(str(a) for a in argv)[:160].replace("\\n", " "))
    _sys.addaudithook(_hook)
    _put("ready", " ".join(_sys.argv)[:160] or "-")
# the environment's own sitecustomize, if any, as without this tool
import importlib.machinery as _m, importlib.util as _u
_here = _os.path.dirname(_os.path.abspath(__file__))
_spec = _m.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
"""

WORKER = """import time; _T = time.time()
import os
with open(os.path.join(os.environ["START_TIMELINE_DIR"], "user.%d" % os.getpid()), "w") as f:
    f.write(repr(_T))
"""


def one_run(
    command: list[str], tool_dir: str, timeout_s: float, imports: str | None = None, cpu: bool = False
) -> list[tuple[float, int, str, str]]:
    """Run the launcher once; its processes' events (seconds after exec, pid, kind, what), in time
    order. ``cpu``: the process's own CPU seconds at each event instead (the user code line has none)."""
    events_dir = tempfile.mkdtemp(prefix="run-", dir=tool_dir)
    env = dict(os.environ, START_TIMELINE_DIR=events_dir, START_TIMELINE_IMPORTS=imports or "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (tool_dir, os.environ.get("PYTHONPATH", "")) if p)
    t_exec = time.time()
    subprocess.run(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout_s,
        check=False,
    )
    events: list[tuple[float, float, int, str, str]] = []  # wall time (the order), the value, ...
    for name in os.listdir(events_dir):
        path = os.path.join(events_dir, name)
        with open(path) as f:
            if name.startswith("user."):
                if not cpu:
                    t_user = float(f.read()) - t_exec
                    events.append((t_user, t_user, int(name[5:]), "user-code", "-"))
                continue
            for line in f:
                t, t_cpu, pid, kind, what = line.rstrip("\n").split(" ", 4)
                events.append((float(t) - t_exec, float(t_cpu) if cpu else float(t) - t_exec, int(pid), kind, what))
    return [(value, pid, kind, what) for _t, value, pid, kind, what in sorted(events)]


def milestones(events: list[tuple[float, int, str, str]]) -> dict[str, float]:
    """Name -> seconds after exec. The launcher is the first process ready; its forks and spawns are
    numbered in order; a worker is the process that ran user code (the last one, for N > 1)."""
    if not events:
        return {}
    launcher = next(pid for _t, pid, kind, _w in events if kind == "ready")
    out: dict[str, float] = {}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    workers = {pid for _t, pid, kind, _w in events if kind == "user-code"}
    last_worker = max((e for e in events if e[2] == "user-code"), default=None)
    for t, pid, kind, what in events:
        if pid == launcher:
            who = "launcher"
        elif last_worker is not None and pid == last_worker[1]:
            who = "last worker"
        elif pid in workers:
            continue
        else:
            who = "other"
        if kind in ("fork", "posix_spawn", "Popen", "exec"):
            counts[(who, kind)] += 1
            key = f"{who}: {kind} #{counts[(who, kind)]}"
            if kind != "fork":
                key += f" ({what.split()[0].rsplit('/', 1)[-1] if what.strip() else '?'})"
        elif kind == "import":
            key = f"{who}: import {what}"
        elif kind == "ready":
            key = f"{who}: interpreter ready"
        else:
            key = f"{who}: user code"
        out.setdefault(key, t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    ap.add_argument("--json", help="write every run's events and the medians here")
    ap.add_argument("--imports", metavar="PREFIX", help="also the first import of every module named PREFIX...")
    ap.add_argument(
        "--cpu", action="store_true", help="each process's own CPU seconds at its events (steadier on a shared box)"
    )
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("give the launcher command after --")
    tool_dir = tempfile.mkdtemp(prefix="start-timeline-")
    with open(os.path.join(tool_dir, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE.replace("@MARKERS@", repr(MARKER_MODULES)))
    worker = os.path.join(tool_dir, "timeline_worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    runs = []
    try:
        one_run([*command, worker], tool_dir, a.timeout_s, a.imports, a.cpu)  # warm-up: page cache, bytecode
        for _ in range(a.reps):
            runs.append(one_run([*command, worker], tool_dir, a.timeout_s, a.imports, a.cpu))
    finally:
        import shutil

        shutil.rmtree(tool_dir, ignore_errors=True)
    per_run = [milestones(r) for r in runs]
    keys = sorted({k for m in per_run for k in m}, key=lambda k: statistics.median(m[k] for m in per_run if k in m))
    medians = {k: statistics.median(m[k] for m in per_run if k in m) for k in keys}
    unit = "CPU seconds of the process" if a.cpu else "seconds after exec"
    print(f"{' '.join(command)}  (median of {len(runs)}; {unit})")
    for k in keys:
        seen = sum(k in m for m in per_run)
        print(f"  {medians[k]:8.4f}  {k}" + (f"  [{seen}/{len(runs)} runs]" if seen != len(runs) else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": command, "medians_s": medians, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
