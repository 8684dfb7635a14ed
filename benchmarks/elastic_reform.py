"""From a node lost to the survivors' workers running again in the new world (issue 18), under
openclaw-launch and torchrun, on one host (loopback "nodes"), with torchrun's verbatim elastic line
and default settings:

    --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --max-restarts 3

Two launchers start (the first hosts the rendezvous); once both ranks run in a world of 2
(tests/elastic_worker.py), the second node is lost: its launcher and every process under it are
SIGKILLed at once (a node that dies takes its workers with it). Per run:

- ``spawn_s``: the kill -> the survivor's new worker process starts (the launcher's part);
- ``running_s``: the kill -> that worker is in the new world (after ``init_process_group``;
  it includes the worker's own ``import torch``, seconds on a loaded 2-core box);
- ``exit``: the survivor's exit code, and ``end_s``: the kill -> it exited.

``--scenario grow``: a second node joins a running world of one (``last_call_timeout=1``); per
run ``joined_s``, its start -> both nodes' workers in the world of two, and the exit codes.

``python benchmarks/elastic_reform.py [--scenario shrink|grow] [--runs N] [--launchers ours,torchrun]
[--timeout-s S]`` prints one line per run and the medians; a run that does not finish in
``--timeout-s`` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "elastic_worker.py")
WORKER_ARGS = ("--first-steps", "100000", "--steps", "3")
_NEW_WORLD = re.compile(r"size 1 nodes 1 group 0 restart (\d+) started ([\d.]+) at ([\d.]+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(which: str, port: int) -> list[str]:
    line = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "3"]
    head = [sys.executable, "-m", "openclaw_launch"] if which == "ours" else ["torchrun"]
    return [*head, *line, WORKER, *WORKER_ARGS]


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (psutil follows the setsid'd workers too)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_node(pid: int) -> float:
    """SIGKILL the launcher and everything under it at once; the time of the kill."""
    victims = [pid, *descendants(pid)]
    at = time.time()
    for p in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return at


def wait_text(path: Path, text: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return True
        time.sleep(0.05)
    return False


def one_run(which: str, timeout_s: float, workdir: Path) -> dict[str, object]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    outs = [workdir / f"{which}-{k}.out" for k in (0, 1)]
    procs = []
    for k, out in enumerate(outs):
        with out.open("w") as f, (workdir / f"{which}-{k}.err").open("w") as err:
            procs.append(subprocess.Popen(command(which, port), cwd=ROOT, env=env, stdout=f, stderr=err))
        if k == 0:  # the first launcher hosts the rendezvous
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
    result: dict[str, object] = {"launcher": which}
    try:
        if not (wait_text(outs[0], "size 2", timeout_s) and wait_text(outs[1], "size 2", timeout_s)):
            result["error"] = "never ran in a world of 2"
            return result
        killed = kill_node(procs[1].pid)
        procs[1].wait()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not _NEW_WORLD.search(outs[0].read_text()):
            time.sleep(0.05)
        found = _NEW_WORLD.search(outs[0].read_text())
        if found is None:
            result["error"] = f"no worker in a world of 1 within {timeout_s:g} s"
            return result
        result["spawn_s"] = float(found.group(2)) - killed
        result["running_s"] = float(found.group(3)) - killed
        try:
            result["exit"] = procs[0].wait(timeout=timeout_s)
            result["end_s"] = time.time() - killed
        except subprocess.TimeoutExpired:
            result["exit"] = f"still running {timeout_s:g} s after the new world ran"
        return result
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_node(proc.pid)
                proc.wait()


def grow_run(which: str, timeout_s: float, workdir: Path) -> dict[str, object]:
    """A second node joins a running world of one (``last_call_timeout=1``): its start -> both
    nodes' workers in the world of two (``joined_s``), and both exit codes."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    line = [*command(which, port)[: -len(WORKER_ARGS) - 1], "--rdzv-conf", "last_call_timeout=1"]
    outs = [workdir / f"grow-{which}-{k}.out" for k in (0, 1)]
    procs: list[subprocess.Popen[bytes]] = []
    result: dict[str, object] = {"launcher": which, "scenario": "grow"}
    try:
        for k, out in enumerate(outs):
            if k == 1 and not wait_text(outs[0], "size 1 nodes 1", timeout_s):
                result["error"] = "the first node never ran alone"
                return result
            started = time.time()
            with out.open("w") as f, (workdir / f"grow-{which}-{k}.err").open("w") as err:
                procs.append(subprocess.Popen([*line, WORKER, "--want", "2"], cwd=ROOT, env=env, stdout=f, stderr=err))
        if not wait_text(outs[0], "size 2", timeout_s) or not wait_text(outs[1], "size 2", timeout_s):
            codes = [p.wait(timeout=timeout_s) if p.poll() is None else p.returncode for p in procs]
            result["error"] = f"no world of two within {timeout_s:g} s; exit codes {codes}"
            return result
        joined = max(float(m.group(1)) for o in outs for m in re.finditer(r"size 2 .* at ([\d.]+)", o.read_text()))
        result["joined_s"] = joined - started
        result["exit"] = [p.wait(timeout=timeout_s) for p in procs]
        return result
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_node(proc.pid)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launchers", default="ours,torchrun")
    parser.add_argument("--timeout-s", type=float, default=90.0)
    parser.add_argument("--scenario", choices=("shrink", "grow"), default="shrink")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        print(f"load average at start: {f.read().split()[0]}")
    results: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            for which in args.launchers.split(","):
                r = (one_run if args.scenario == "shrink" else grow_run)(which, args.timeout_s, Path(tmp))
                results.setdefault(which, []).append(r)
                print(f"run {run} {r}", flush=True)
    for which, runs in results.items():
        if args.scenario == "grow":
            joined = [float(str(r["joined_s"])) for r in runs if "joined_s" in r]
            median = f"; median joined_s {statistics.median(joined):.2f}" if joined else ""
            print(f"{which}: {len(joined)}/{len(runs)} grew to a world of two{median}")
            continue
        done = [r for r in runs if "spawn_s" in r]
        if not done:
            print(f"{which}: no run re-formed")
            continue
        spawn = statistics.median(float(str(r["spawn_s"])) for r in done)
        running = statistics.median(float(str(r["running_s"])) for r in done)
        print(f"{which}: {len(done)}/{len(runs)} re-formed; median spawn_s {spawn:.2f}, running_s {running:.2f}")


if __name__ == "__main__":
    main()
