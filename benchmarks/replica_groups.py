"""torchft's replica groups after a SIGKILL (issue 31): how long until the killed group steps again,
and how many steps the other group lost, under ``openclaw-launch --replica-groups 2`` and under
torchft's own recipe with torchrun (a lighthouse, then one ``torchrun --max_restarts 1`` per
replica group with REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, its port and TORCHFT_LIGHTHOUSE set by
hand), interleaved, on CPU with gloo.

Each run: two groups of one rank of tests/torchft_groups_worker.py (torchft's DDP example: Manager,
DDP, Optimizer; a step every ``--step-s``), both stepping for ``--warm-s``; then group 1's rank is
SIGKILLed; the run goes on until the restarted rank has stepped for ``--after-s``. From every
committed step's time (the workers' CLOCK_MONOTONIC, the clock of the kill):

- ``rejoin_s``: from the kill to the restarted group's first committed step;
- ``lost``: the other group's steps missing over [kill, rejoin + after-s], against its own rate in
  the ``--warm-s`` before the kill (0: it never slowed);
- ``stall_s``: the other group's longest gap between two steps in that window, and its median gap
  before the kill;
- ``report_rejoin_s`` (ours only): what the launcher's report says (its failure seen to the first
  step's statistics).

    python benchmarks/replica_groups.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from openclaw_launch.plan.replica_groups import lighthouse_argv  # noqa: E402

WORKER = ROOT / "tests" / "torchft_groups_worker.py"
GUARD_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def steps(marks: Path, group: int) -> list[tuple[int, float, int]]:
    """Every committed step of the group: (step, monotonic time, attempt)."""
    path = marks / f"steps-g{group}-r0.log"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0]), float(parts[1]), int(parts[2])))
    return out


def wait(predicate: object, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def start_ours(marks: Path, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    line = ["--nproc-per-node", "2", "--replica-groups", "2", "--max-restarts", "1", "--report", str(marks / "r.json")]
    worker = [str(WORKER), "--mark-dir", str(marks), "--step-s", str(args.step_s)]
    return [_popen([sys.executable, "-m", "openclaw_launch", *line, *worker], marks / "ours.log", {})]


def start_torchrun(marks: Path, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    """torchft's README recipe: the lighthouse, then a torchrun per replica group."""
    port = free_port()
    lighthouse = shutil.which("torchft_lighthouse", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert lighthouse, "torchft is not installed"
    procs = [
        _popen(
            list(lighthouse_argv(lighthouse, port, "127.0.0.1")),  # the same settings as ours
            marks / "lighthouse.log",
            {},
        )
    ]
    for group in range(2):
        env = {
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": "2",
            "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}",
        }
        line = ["--master_port", str(free_port()), "--nnodes", "1", "--nproc_per_node", "1", "--max_restarts", "1"]
        worker = [str(WORKER), "--mark-dir", str(marks), "--step-s", str(args.step_s)]
        procs.append(
            _popen([sys.executable, "-m", "torch.distributed.run", *line, *worker], marks / f"g{group}.log", env)
        )
    return procs


def _popen(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


def one_run(launcher: str, args: argparse.Namespace) -> dict[str, object]:
    marks = Path(tempfile.mkdtemp(prefix=f"rg-{launcher}-"))
    procs = (start_ours if launcher == "ours" else start_torchrun)(marks, args)
    try:
        wait(lambda: len(steps(marks, 0)) > 3 and len(steps(marks, 1)) > 3, "both groups to step")
        time.sleep(args.warm_s)
        kill_t = time.monotonic()
        os.kill(int((marks / "pid-g1-r0-a0").read_text()), signal.SIGKILL)
        wait(lambda: any(a == 1 for _, _, a in steps(marks, 1)), "group 1 to step again")
        rejoin_t = next(t for _, t, a in steps(marks, 1) if a == 1)
        time.sleep(args.after_s)
        end_t = rejoin_t + args.after_s
        last = max((step for step, _, _ in steps(marks, 0)), default=0)
        (marks / ".stop").write_text(str(last + 5))  # every group ends after the same step
        (marks / ".stop").replace(marks / "stop")
        for p in procs[::-1]:
            if p is not procs[0] or launcher == "ours":
                p.wait(timeout=GUARD_S)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    other = steps(marks, 0)
    before = [t for _, t, _ in other if kill_t - args.warm_s <= t < kill_t]
    rate = (len(before) - 1) / (before[-1] - before[0])
    during = [t for _, t, _ in other if kill_t <= t <= end_t]
    around = [t for _, t, _ in other if t >= before[-1] and t <= end_t]
    result: dict[str, object] = {
        "launcher": launcher,
        "rejoin_s": round(rejoin_t - kill_t, 2),
        "lost": max(0, round(rate * (end_t - kill_t)) - len(during)),
        "stall_s": round(max(b - a for a, b in zip(around, around[1:], strict=False)), 2),
        "median_gap_s": round(statistics.median(b - a for a, b in zip(before, before[1:], strict=False)), 3),
        "steps_per_s": round(rate, 1),
    }
    if launcher == "ours":
        report = json.loads((marks / "r.json").read_text())
        result["report_rejoin_s"] = report["groups"][1]["progress"]["rejoin_s"]
        result["exit_code"] = report["exit_code"]
    if not args.keep:
        shutil.rmtree(marks, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per launcher, interleaved")
    parser.add_argument("--launchers", default="ours,torchrun")
    parser.add_argument("--step-s", type=float, default=0.05, help="the workers' pause per step")
    parser.add_argument("--warm-s", type=float, default=3.0, help="stepping before the kill (the rate's window)")
    parser.add_argument("--after-s", type=float, default=3.0, help="stepping after the killed group's first step")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory (logs, step marks)")
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        for launcher in args.launchers.split(","):
            result = one_run(launcher, args)
            print(json.dumps(result), flush=True)
            results.append(result)
    for launcher in args.launchers.split(","):
        mine = [r for r in results if r["launcher"] == launcher]
        rejoin = statistics.median(float(r["rejoin_s"]) for r in mine)  # type: ignore[arg-type]
        lost = statistics.median(int(r["lost"]) for r in mine)  # type: ignore[call-overload]
        print(f"{launcher}: median rejoin {rejoin:.2f} s, median steps lost by the other group {lost}")


if __name__ == "__main__":
    main()
