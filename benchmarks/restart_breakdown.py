"""Where a restart's time goes (issue 33): from a rank's failure until every rank steps again, split
into its parts, under openclaw-launch and torchrun in the same run (torchrun is the reference).

The job: 4 gloo ranks on CPU (the worker below, written to a temporary directory), one all-reduce
and a 50 ms sleep per step; rank 1 raises at step 10 of attempt 0 only; ``--max-restarts 2``; the
same command line for both launchers (``--standalone --nproc-per-node 4 --max-restarts 2``).
Launchers run interleaved, ``--reps`` repetitions each.

Each worker appends JSON events to a shared file (wall clock, ``time.time()``): its process start
(from ``/proc/self/stat``, 10 ms ticks), ``import torch`` done, ``init_process_group`` done, the first
step done, and rank 1's raise. A monitor thread here polls every worker's ``/proc/PID/stat`` every
2 ms for its end (gone, or a zombie not yet reaped). The parts, each the launcher's or the script's:

- ``fail_exit_s``: the raise -> rank 1's process ended (the traceback, the interpreter's exit: the script's);
- ``teardown_s``: rank 1 ended -> the last other old rank ended (detection + SIGTERM + the others'
  exit: the launcher's, bounded by the grace period);
- ``respawn_s``: the last old rank ended -> the first new worker process started (reaping, cleanup,
  the backoff, the new attempt's files, the fork: the launcher's);
- ``spawn_spread_s``: first -> last new worker started;
- ``import_s``: last new worker started -> the last one's ``import torch`` done (the interpreter, the
  launcher's worker-side start-up, torch);
- ``pg_s``: -> the last ``init_process_group`` done (rendezvous, the store, gloo's mesh);
- ``first_step_s``: -> the last rank's first step done;
- ``total_s``: the raise -> every rank's first step of attempt 1.

``python benchmarks/restart_breakdown.py [--reps 3] [--launchers ours,prewarm,torchrun] [--timeout-s 120]
[--ours NAME=DIR ...] [--json OUT]``; ``--ours before=DIR`` also runs the openclaw_launch package of
another checkout (``git worktree add --detach DIR <commit>``) as launcher ``before``. ``prewarm`` is
ours with ``--prewarm torch`` (a zygote that imported torch once forks every worker; an ``--ours``
tree named ``NAME-prewarm`` runs so too). One line per
run, then the medians per launcher and each part's ratio to torchrun's (the parts torchrun reached:
torch 2.13's own restart of this gloo job fails in the new attempt's ``init_process_group``).

The peers (NVIDIA's ``ft_launcher``, issue 33's fastest) run from their own virtual environment,
never this project's: ``python -m venv --system-site-packages /tmp/peers && /tmp/peers/bin/pip install
nvidia-resiliency-ext``, then ``--launchers torchrun,ft_launcher --peers-venv /tmp/peers`` (the venv
sees the system's torch, so every launcher runs the same torch).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
RANKS = 4
FAIL_RANK = 1
FAIL_STEP = 10
STEPS = 20  # of attempt 1 (and of attempt 0 for the ranks that do not fail)
PARTS = ("fail_exit_s", "teardown_s", "respawn_s", "spawn_spread_s", "import_s", "pg_s", "first_step_s", "total_s")

WORKER = r"""
import json, os, sys, time

EVENTS = os.environ["RB_EVENTS"]
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def event(name, t=None):
    line = json.dumps({"rank": RANK, "attempt": ATTEMPT, "pid": os.getpid(), "event": name, "t": t or time.time()})
    fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\n").encode())
    os.close(fd)


def started_at():
    ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    uptime = float(open("/proc/uptime").read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


event("start", started_at())
import torch
import torch.distributed as dist

event("torch")
dist.init_process_group("gloo")
event("pg")
x = torch.ones(4)
for step in range(int(os.environ["RB_STEPS"])):
    if ATTEMPT == 0 and RANK == int(os.environ["RB_FAIL_RANK"]) and step == int(os.environ["RB_FAIL_STEP"]):
        event("fail")
        raise RuntimeError("injected failure")
    dist.all_reduce(x)
    time.sleep(0.05)
    if step == 0:
        event("step")
dist.destroy_process_group()
"""


@dataclass
class Run:
    launcher: str
    rep: int
    exit_code: int | None
    recovered: bool
    parts: dict[str, float]


class Monitor(threading.Thread):
    """Polls every worker named in the events file for its end (gone or a zombie)."""

    def __init__(self, events: Path) -> None:
        super().__init__(daemon=True)
        self.events, self.ended, self.stop = events, {}, threading.Event()
        self.pids: set[int] = set()

    def run(self) -> None:
        offset = 0
        while not self.stop.is_set():
            if self.events.exists():
                with self.events.open() as f:
                    f.seek(offset)
                    for line in f.readlines():
                        self.pids.add(json.loads(line)["pid"])
                    offset = f.tell()
            now = time.time()
            for pid in self.pids - set(self.ended):
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except (FileNotFoundError, ProcessLookupError):
                    state = "gone"
                if state in ("Z", "X", "gone"):
                    self.ended[pid] = now
            time.sleep(0.002)


PEERS = ("ft_launcher",)  # the peers' launchers, from --peers-venv's bin/
PREWARMED = ("prewarm",)  # ours with --prewarm torch (also NAME-prewarm for an --ours tree NAME)


def command(launcher: str, peers_venv: str | None) -> list[str]:
    line = ["--standalone", "--nproc-per-node", str(RANKS), "--max-restarts", "2"]
    if launcher in PEERS:
        if peers_venv is None:
            raise SystemExit(f"{launcher}: give --peers-venv (see the module docstring)")
        return [str(Path(peers_venv) / "bin" / launcher), *line]
    head = ["torchrun"] if launcher == "torchrun" else [sys.executable, "-m", "openclaw_launch"]
    if launcher in PREWARMED or launcher.endswith("-prewarm"):  # a zygote holding torch forks the workers
        head += ["--prewarm", "torch"]
    return [*head, *line]


def kill_leftovers(pgid: int, tmp: str) -> None:
    """The launcher's process group, and any worker of this run left behind (torchrun, killed on a
    timeout, leaves its workers running under init)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(tmp in part for part in proc.info["cmdline"] or ()):
                proc.kill()


def one_run(launcher: str, rep: int, timeout_s: float, tree: str | None, peers_venv: str | None) -> Run:
    with tempfile.TemporaryDirectory(prefix="restart-bench-") as tmp:
        script, events = Path(tmp) / "worker.py", Path(tmp) / "events.jsonl"
        script.write_text(WORKER)
        env = {**os.environ, "RB_EVENTS": str(events), "RB_STEPS": str(STEPS)}
        env.update(RB_FAIL_RANK=str(FAIL_RANK), RB_FAIL_STEP=str(FAIL_STEP), OMP_NUM_THREADS="1")
        if tree is not None:  # another checkout's openclaw_launch
            env["PYTHONPATH"] = tree
        monitor = Monitor(events)
        monitor.start()
        cmd = [*command(launcher, peers_venv), str(script)]
        err_path = Path(tmp) / "stderr.txt"
        with err_path.open("w") as err_file:  # a file, not a pipe: a leftover worker cannot hold it open
            proc = subprocess.Popen(
                cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True
            )
            try:
                code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = None
        kill_leftovers(proc.pid, tmp)
        proc.wait()
        err = err_path.read_text(errors="replace")
        time.sleep(0.05)
        monitor.stop.set()
        monitor.join()
        rows = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
        parts = breakdown(rows, monitor.ended)
        if code != 0 and not parts:
            sys.stderr.write(f"{launcher} rep {rep}: exit {code}\n{err[-2000:]}\n")
        return Run(launcher, rep, code, code == 0 and "total_s" in parts, parts)


def breakdown(rows: list[dict[str, object]], ended: dict[int, float]) -> dict[str, float]:
    def at(attempt: int, name: str) -> list[float]:
        return [float(r["t"]) for r in rows if r["attempt"] == attempt and r["event"] == name]  # type: ignore[arg-type]

    fail = at(0, "fail")
    old = {int(r["pid"]): int(r["rank"]) for r in rows if r["attempt"] == 0}  # type: ignore[call-overload]
    if not fail or any(pid not in ended for pid in old):
        return {}
    failed_end = next(ended[pid] for pid, rank in old.items() if rank == FAIL_RANK)
    t = [fail[0], failed_end, max(ended[pid] for pid in old)]
    for name in ("start", "start", "torch", "pg", "step"):  # as far as attempt 1 got (torchrun's may not)
        times = at(1, name)
        if len(times) < RANKS:
            break
        t.append(min(times) if len(t) == 3 else max(times))
    values = [b - a for a, b in zip(t, t[1:], strict=False)]
    parts = dict(zip(PARTS, values, strict=False))
    if len(t) == len(PARTS):
        parts["total_s"] = t[-1] - t[0]
    return parts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--launchers", default="ours,torchrun")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument(
        "--ours",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also run openclaw_launch from the checkout DIR, as launcher NAME (repeatable; e.g. before=/tmp/b)",
    )
    ap.add_argument("--peers-venv", default=None, help="the peers' virtual environment (ft_launcher)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    trees = dict(item.split("=", 1) for item in args.ours)
    launchers = [*args.launchers.split(","), *trees]
    runs: list[Run] = []
    for rep in range(args.reps):
        for launcher in launchers:  # interleaved: the box's load falls on both alike
            run = one_run(launcher, rep, args.timeout_s, trees.get(launcher), args.peers_venv)
            runs.append(run)
            cells = " ".join(f"{k}={v:.2f}" for k, v in run.parts.items())
            print(f"{launcher:9} rep {rep} exit {run.exit_code} recovered {run.recovered} {cells}", flush=True)
    medians: dict[str, dict[str, float]] = {}
    for launcher in launchers:
        mine = [r for r in runs if r.launcher == launcher]
        print(f"{launcher:9} recovered {sum(r.recovered for r in mine)}/{args.reps}")
        medians[launcher] = {
            k: statistics.median(r.parts[k] for r in mine if k in r.parts)
            for k in PARTS
            if any(k in r.parts for r in mine)
        }
        print("  median " + " ".join(f"{k}={v:.2f}" for k, v in medians[launcher].items()))
    for reference in ("torchrun", *PEERS):
        theirs = medians.get(reference, {})
        for launcher, m in medians.items():
            if launcher != reference and theirs:
                ratios = " ".join(f"{k}={m[k] / theirs[k]:.2f}x" for k in m if theirs.get(k))
                print(f"{launcher:9} vs {reference} (the parts it reached): {ratios}")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": [asdict(r) for r in runs], "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
