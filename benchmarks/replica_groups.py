"""torchft's replica groups after a SIGKILL (issue 31): how long until the killed group steps again,
and how many steps the other group lost, under ``openclaw-launch --replica-groups 2`` (``ours``:
openclaw's lighthouse, told at once that a group is gone; ``ours-torchft``: ``--lighthouse
torchft``, torchft's, which waits for the dead group's heartbeat to expire) and under torchft's own
recipe with torchrun (a lighthouse, then one ``torchrun --max_restarts 1`` per
replica group with REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, its port and TORCHFT_LIGHTHOUSE set by
hand), interleaved, on CPU with gloo.

Each run: two groups (``--groups``) of one rank (``--ranks-per-group``) of
tests/torchft_groups_worker.py (torchft's DDP example: Manager, DDP, Optimizer; a step every
``--step-s``), groups 0 and 1 stepping for ``--warm-s``; then group 1's rank 0 is SIGKILLed; the run
goes on until the restarted rank has stepped for ``--after-s``. With ``--balanced`` nothing is
killed: the same measures over ``--after-s`` from the same instant (a live group must lose nothing:
no quorum change, no discarded step). ``--load N`` runs N busy loops (one CPU each) beside it from
the start, the loaded box on which a lighthouse heartbeat timeout too short would drop a live group.
From every committed step's time (the workers' CLOCK_MONOTONIC, the clock of the kill):

- ``rejoin_s``: from the kill to the restarted group's first committed step;
- ``lost``: the other group's steps missing over [kill, rejoin + after-s], against its own rate in
  the ``--warm-s`` before the kill (0: it never slowed);
- ``discarded``: the other group's steps torchft discarded in that window (made, not committed: its
  allreduce failed with the dead peer, or its quorum did); the step in flight at the kill is lost
  this way unless the kill falls between its commit and the next allreduce;
- ``resumed_s``: from the kill to the other group's first committed step after it (its stall: the
  discarded step, the next quorum's wait for the lighthouse to count the killed group gone, and the
  reconfiguration without it);
- ``stall_s``: the other group's longest gap between two steps in that window, and its median gap
  before the kill; ``stall_steps``: the steps that gap cost (stall_s / median gap, less the one
  step a gap always is). ``lost`` nets out a faster or slower rate elsewhere in the window (alone
  the survivor steps faster; beside a restarting rank's imports, slower); ``stall_steps`` does not;
- ``quorum_changes``: the quorum changes the lighthouse made in that window (its log): 2 after a
  kill (without the killed group, with it again), 0 when balanced;
- ``report_rejoin_s`` (ours, ours-torchft): what the launcher's report says (its failure seen to the first
  step's statistics);
- ``oldest_heartbeat_s`` (``--balanced``, torchft's lighthouse only): the oldest heartbeat of a
  live group the lighthouse's ``/status`` page showed, polled every 20 ms over the window (the
  heartbeat timeout's margin).

    python benchmarks/replica_groups.py --runs 5 --launchers ours,ours-torchft,torchrun
    python benchmarks/replica_groups.py --runs 3 --balanced --load 8
    python benchmarks/replica_groups.py --runs 1 --balanced --load 10 --launchers torchrun --heartbeat-timeout-ms 120
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from openclaw_launch.plan.replica_groups import lighthouse_argv  # noqa: E402

WORKER = ROOT / "tests" / "torchft_groups_worker.py"
GUARD_S = 120.0


#: ``--launchers``' own: each lighthouse ``openclaw-launch --lighthouse`` is given.
LIGHTHOUSE_OF = {"ours": "openclaw", "ours-torchft": "torchft"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def steps(marks: Path, group: int, log: str = "steps") -> list[tuple[int, float, int]]:
    """Every committed step of the group (``discarded``: every discarded one): (step, monotonic time, attempt)."""
    path = marks / f"{log}-g{group}-r0.log"
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


def quorum_changes(log: Path, since_wall_s: float, until_wall_s: float) -> int:
    """The lighthouse's quorum changes between two wall-clock times (its lines are stamped in local time)."""
    count = 0
    for line in log.read_text(errors="replace").splitlines():
        if "Detected quorum change" in line:
            stamp = datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            count += since_wall_s <= stamp <= until_wall_s
    return count


def heartbeat_ages(lighthouse: str, until_t: float) -> float:
    """The oldest heartbeat of a live group the lighthouse's status page shows (``seen S ago``), polled
    every 20 ms until ``until_t``: how late a heartbeat can be on this box (the heartbeat timeout's margin)."""
    oldest_s = 0.0
    while time.monotonic() < until_t:
        with urllib.request.urlopen(f"{lighthouse}/status", timeout=GUARD_S) as page:
            ages = re.findall(r"seen ([0-9.e-]+)s ago", page.read().decode(errors="replace"))
        oldest_s = max([oldest_s, *(float(age) for age in ages)])
        time.sleep(0.02)
    return oldest_s


def start_ours(marks: Path, args: argparse.Namespace, lighthouse: str) -> list[subprocess.Popen[bytes]]:
    ranks = str(args.groups * args.ranks_per_group)
    line = ["--nproc-per-node", ranks, "--replica-groups", str(args.groups), "--max-restarts", "1"]
    line += ["--report", str(marks / "r.json")]
    line += ["--lighthouse", lighthouse]
    line += ["--log-dir", str(marks / "logs"), "--run-id", "bench"]
    worker = [str(WORKER), "--mark-dir", str(marks), "--step-s", str(args.step_s)]
    return [_popen([sys.executable, "-m", "openclaw_launch", *line, *worker], marks / "ours.log", {})]


def start_torchrun(marks: Path, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    """torchft's README recipe: the lighthouse, then a torchrun per replica group."""
    port = free_port()
    lighthouse = shutil.which("torchft_lighthouse", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    assert lighthouse, "torchft is not installed"
    procs = [
        _popen(
            _with_timeout(list(lighthouse_argv((lighthouse,), port, "127.0.0.1")), args.heartbeat_timeout_ms),
            marks / "lighthouse.log",
            {},
        )
    ]
    for group in range(args.groups):
        env = {
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(args.groups),
            "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}",
        }
        line = ["--master_port", str(free_port()), "--nnodes", "1", "--nproc_per_node", str(args.ranks_per_group)]
        line += ["--max_restarts", "1"]
        worker = [str(WORKER), "--mark-dir", str(marks), "--step-s", str(args.step_s)]
        procs.append(
            _popen([sys.executable, "-m", "torch.distributed.run", *line, *worker], marks / f"g{group}.log", env)
        )
    return procs


def _with_timeout(argv: list[str], timeout_ms: int | None) -> list[str]:
    """The lighthouse's argv (ours: config/defaults.py's settings), its heartbeat and join timeouts
    ``timeout_ms`` where given (the recipe only: how short a timeout drops live groups)."""
    if timeout_ms is not None:
        for flag in ("--heartbeat_timeout_ms", "--join_timeout_ms"):
            argv[argv.index(flag) + 1] = str(timeout_ms)
    return argv


def _popen(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    out = open(log, "wb")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


def one_run(launcher: str, args: argparse.Namespace) -> dict[str, object]:
    marks = Path(tempfile.mkdtemp(prefix=f"rg-{launcher}-"))
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    ours = launcher.startswith("ours")
    procs = start_ours(marks, args, LIGHTHOUSE_OF[launcher]) if ours else start_torchrun(marks, args)
    try:
        wait(lambda: len(steps(marks, 0)) > 3 and len(steps(marks, 1)) > 3, "both groups to step")
        time.sleep(args.warm_s)
        kill_t, kill_wall_s = time.monotonic(), time.time()
        if args.balanced:
            rejoin_t = kill_t
        else:
            os.kill(int((marks / "pid-g1-r0-a0").read_text()), signal.SIGKILL)
            wait(lambda: any(a == 1 for _, _, a in steps(marks, 1)), "group 1 to step again")
            rejoin_t = next(t for _, t, a in steps(marks, 1) if a == 1)
        end_t = rejoin_t + args.after_s
        torchfts = launcher != "ours"  # torchft's lighthouse: its /status page
        oldest_s = heartbeat_ages((marks / "lighthouse").read_text(), end_t) if args.balanced and torchfts else None
        time.sleep(max(0.0, end_t - time.monotonic()))
        end_wall_s = kill_wall_s + (end_t - kill_t)
        loadavg = os.getloadavg()[0]
        last = max((step for step, _, _ in steps(marks, 0)), default=0)
        (marks / ".stop").write_text(str(last + 5))  # every group ends after the same step
        (marks / ".stop").replace(marks / "stop")
        for p in procs[::-1]:
            if p is not procs[0] or ours:
                p.wait(timeout=GUARD_S)
    finally:
        for p in procs + load:
            p.kill()
            p.wait()
    other = steps(marks, 0)
    before = [t for _, t, _ in other if kill_t - args.warm_s <= t < kill_t]
    rate = (len(before) - 1) / (before[-1] - before[0])
    during = [t for _, t, _ in other if kill_t <= t <= end_t]
    around = [t for _, t, _ in other if t >= before[-1] and t <= end_t]
    stall_s = max(b - a for a, b in zip(around, around[1:], strict=False))
    median_gap_s = statistics.median(b - a for a, b in zip(before, before[1:], strict=False))
    lighthouse_log = next((marks / "logs").rglob("lighthouse.log")) if ours else marks / "lighthouse.log"
    result: dict[str, object] = {
        "launcher": launcher,
        "rejoin_s": round(rejoin_t - kill_t, 2),
        "lost": max(0, round(rate * (end_t - kill_t)) - len(during)),
        "discarded": sum(kill_t <= t <= end_t for _, t, _ in steps(marks, 0, "discarded")),
        "resumed_s": round(during[0] - kill_t, 3) if during else None,
        "stall_s": round(stall_s, 2),
        "median_gap_s": round(median_gap_s, 3),
        "stall_steps": max(0, round(stall_s / median_gap_s) - 1),
        "steps_per_s": round(rate, 1),
        "quorum_changes": quorum_changes(lighthouse_log, kill_wall_s, end_wall_s),
        "load": round(loadavg, 1),
    }
    if oldest_s is not None:
        result["oldest_heartbeat_s"] = round(oldest_s, 3)
    if ours and not args.balanced:
        report = json.loads((marks / "r.json").read_text())
        result["report_rejoin_s"] = report["groups"][1]["progress"]["rejoin_s"]
        result["exit_code"] = report["exit_code"]
    if not args.keep:
        shutil.rmtree(marks, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per launcher, interleaved")
    parser.add_argument("--launchers", default="ours,ours-torchft,torchrun", help="of ours, ours-torchft, torchrun")
    parser.add_argument("--step-s", type=float, default=0.05, help="the workers' pause per step")
    parser.add_argument("--warm-s", type=float, default=3.0, help="stepping before the kill (the rate's window)")
    parser.add_argument("--after-s", type=float, default=3.0, help="stepping after the killed group's first step")
    parser.add_argument("--balanced", action="store_true", help="kill nothing: what a live group loses")
    parser.add_argument("--load", type=int, default=0, help="busy loops (one CPU each) beside every run")
    parser.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        help="torchrun's recipe only: its lighthouse's heartbeat and join timeouts (default: ours)",
    )
    parser.add_argument("--groups", type=int, default=2, help="replica groups (group 1's rank 0 is killed)")
    parser.add_argument("--ranks-per-group", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep each run's directory (logs, step marks)")
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        for launcher in args.launchers.split(","):
            try:
                result = one_run(launcher, args)
            except TimeoutError as e:  # a run that never got there (said, and left out of the medians)
                print(json.dumps({"launcher": launcher, "failed": f"no {e} within {GUARD_S:g} s"}), flush=True)
                continue
            print(json.dumps(result), flush=True)
            results.append(result)
    for launcher in args.launchers.split(","):
        mine = [r for r in results if r["launcher"] == launcher]
        if not mine:
            continue
        rejoin = statistics.median(float(r["rejoin_s"]) for r in mine)  # type: ignore[arg-type]
        lost = statistics.median(int(r["lost"]) for r in mine)  # type: ignore[call-overload]
        resumed = statistics.median(float(r["resumed_s"] or 0) for r in mine)  # type: ignore[arg-type]
        discarded = sum(int(r["discarded"]) for r in mine)  # type: ignore[call-overload]
        changes = sum(int(r["quorum_changes"]) for r in mine)  # type: ignore[call-overload]
        print(
            f"{launcher}: median rejoin {rejoin:.2f} s, median steps lost by the other group {lost}, its median "
            f"first step after the kill {resumed:.3f} s; in all runs {discarded} discarded step(s), {changes} "
            "quorum change(s)"
        )


if __name__ == "__main__":
    main()
