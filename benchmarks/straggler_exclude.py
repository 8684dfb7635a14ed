"""``--on-straggler exclude`` (issue 28): from a slowdown's start to the job at its earlier pace again, the
steps lost, and how often a balanced job is touched. Real launchers on one host (loopback "nodes"), real
gloo ranks (tests/straggle_worker.py: one all-reduce per step after a sleep in its ``data`` section; rank 0
checkpoints at the launcher's request, every world resumes from the checkpoint), elastic line:

    --nnodes 2:3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT --max-restarts 3
    --on-straggler exclude --stats-interval-s I --straggler-grace-s G  (N and the threshold: the defaults)

``--scenario exclude`` (per run): three nodes and a standby; from step ``--slow-from`` the middle node's
input sleeps ``--slow-ms`` more per step (its launcher's ``STRAGGLE_MS``). From rank 0's step times:

- ``pace_ms``: the median step before the slowdown;
- ``recover_s``: from the slowdown's first step to the first step after which ``--window`` steps in a
  row run at most ``--tolerance`` (20 %) over ``pace_ms`` (the standby in the node's place);
- ``named_s``, ``reform_s``: from the slowdown to the policy's decision (node 0's line), and from the
  workers' stop (the decision plus the grace) to the new world's first step;
- ``lost``: steps done in the old world after its checkpoint (done again in the new one).

Every launcher runs with ``LOGLEVEL=INFO`` (node 0: one line per judged interval; each worker's start and
stop), each line stamped as read (``--keep``: every node's log), so each stage of the chain is stamped,
from node 0's lines (seconds after the slowdown, unless said):
``first_named_s`` (the first judged interval naming the node), ``named_s`` (the decision), ``fate_s``
(decision -> the rendezvous's fate: node 0's checkpoint request), ``stop_s`` (the grace's end -> node 0's
workers gone), ``world_s`` (-> the new world formed), ``joined_s`` (-> its rank 0 in the gloo world:
the new workers' start and ``init_process_group``), ``step_s`` (-> its first step), and
``recover_less_grace_s`` (``recover_s`` less the grace: the grace is the user's, the goal counts the rest).

``--scenario balanced``: two nodes (``--nnodes 1:2``), nobody slow, ``--runs`` times; counts the runs in
which a node was taken out (the goal: none).

``python benchmarks/straggler_exclude.py [--scenario exclude|balanced] [--runs N] [--interval-s I]
[--grace-s G] [--steps S]`` prints one line per run and the medians. torchrun has no such policy: there
is nothing to compare with.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "straggle_worker.py")
_STEP = re.compile(r"step (\d+) at ([\d.]+) restart (\d+)")
_CHECKPOINT = re.compile(r"checkpoint (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(
    work: Path, nnodes: str, nodes: Mapping[str, Mapping[str, str]], args: argparse.Namespace, timeout_s: float
) -> tuple[str, dict[str, int]]:
    """The host (``a``) then each of ``nodes`` (name -> environment; ``standby`` in it: a standby); the
    host's output (its stdout, then stderr, each line with the time it was read) and every exit code."""
    port = free_port()
    line = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "bench"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=30", "--max-restarts", "3"]
    line += ["--on-straggler", "exclude", "--stats-interval-s", str(args.interval_s)]
    line += ["--straggler-grace-s", str(args.grace_s), *args.launcher_args.split()]
    worker = [WORKER, "--steps", str(args.steps), "--step-s", str(args.step_ms / 1000), "--say-every", "1"]
    worker += ["--ckpt", str(work / "ckpt")]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC", "STRAGGLE"))}
    base["PYTHONPATH"] = str(ROOT)
    procs: dict[str, subprocess.Popen[str]] = {}
    logs = {}
    try:
        for name, env in {"a": {}, **nodes}.items():
            extra = ["--standby"] if "standby" in name else []
            logs[name] = (work / f"{name}.log").open("w")
            command = [sys.executable, "-m", "openclaw_launch", *line, *extra, *worker]
            procs[name] = subprocess.Popen(
                command,
                cwd=ROOT,
                env={**base, "LOGLEVEL": "INFO", **env},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )  # each launcher's lines with the time they came (the host's: the measures)
            threading.Thread(target=_stamp, args=(procs[name], logs[name]), daemon=True).start()
            time.sleep(0.5 if name == "a" else 0.2)  # the host listens first; the others arrive in order
        deadline = time.monotonic() + timeout_s
        codes = {}
        for name, p in procs.items():
            codes[name] = p.wait(timeout=max(deadline - time.monotonic(), 1))
        time.sleep(0.2)  # the host's last lines through the stamping thread
        return (work / "a.log").read_text(), codes
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
        for f in logs.values():
            f.close()


def _stamp(proc: subprocess.Popen[str], log: TextIO) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(f"{time.time():.3f} {line}")
        log.flush()


def excluded_run(args: argparse.Namespace, k: int) -> dict[str, float]:
    env = {"STRAGGLE_MS": str(args.slow_ms), "STRAGGLE_FROM": str(args.slow_from)}
    work = Path(tempfile.mkdtemp(prefix="straggler-exclude-", dir=args.keep))
    try:
        text, codes = run_job(work, "2:3", {"standby": {}, "b": env, "c": {}}, args, args.timeout_s)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    steps = [(int(s), float(t), int(r)) for s, t, r in _STEP.findall(text)]
    first = min(r for _, _, r in steps)
    old = [(s, t) for s, t, r in steps if r == first]
    new = [(s, t) for s, t, r in steps if r > first]
    before = [b[1] - a[1] for a, b in zip(old, old[1:], strict=False) if 10 <= a[0] < args.slow_from]
    pace = statistics.median(before)
    slow_t = next(t for s, t in old if s == args.slow_from)
    gaps = [(a[1], b[1] - a[1]) for a, b in zip(new, new[1:], strict=False)]
    recovered_t = next(
        (
            gaps[i][0]
            for i in range(len(gaps) - args.window)
            if all(g <= (1 + args.tolerance) * pace for _, g in gaps[i : i + args.window])
        ),
        float("nan"),
    )
    checkpoint = int(_CHECKPOINT.findall(text)[0]) if _CHECKPOINT.search(text) else 0
    decided = _line_time(text, "straggler policy: taking node")
    first_named = _line_time(text, "1 of 3 in a row", after=slow_t)
    asked = _line_time(text, "checkpoint request:")
    gone = _line_time(text, "info: attempt 0: every worker of this node is gone")
    world = _line_time(text, "openclaw-launch: world 1:")
    joined = _line_time(text, "[rank 0] world rank 0 size", after=asked or slow_t)
    nan = float("nan")
    return {
        "pace_ms": 1000 * pace,
        "recover_s": recovered_t - slow_t,
        "recover_less_grace_s": recovered_t - slow_t - args.grace_s,
        "named_s": decided - slow_t if decided else nan,
        "reform_s": new[0][1] - (decided + args.grace_s) if decided and new else nan,
        "lost": old[-1][0] - checkpoint if old else nan,
        "first_named_s": first_named - slow_t if first_named else nan,
        "fate_s": asked - decided if asked and decided else nan,
        "stop_s": gone - (asked + args.grace_s) if gone and asked else nan,
        "world_s": world - gone if world and gone else nan,
        "joined_s": joined - world if joined and world else nan,
        "step_s": new[0][1] - joined if joined and new else nan,
        "host_exit": codes["a"],
        "excluded_exit": codes["b"],
    }


def _line_time(text: str, marker: str, after: float = 0.0) -> float | None:
    """When node 0 first said ``marker`` after ``after`` (the time its line was read)."""
    times = (float(line.split(" ", 1)[0]) for line in text.splitlines() if marker in line)
    return next((t for t in times if t >= after), None)


def balanced_runs(args: argparse.Namespace) -> None:
    touched = intervals = 0
    for k in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="straggler-balanced-") as tmp:
            text, codes = run_job(Path(tmp), "1:2", {"b": {}}, args, args.timeout_s)
        excluded = "straggler policy: taking node" in text
        named = text.count("; straggler: node")  # node 0's job lines that named a straggler
        policy = [line for line in text.splitlines() if "info: straggler policy: world" in line]  # its intervals
        judged = [line for line in policy if "too few steps" not in line and "not counted" not in line]
        by_policy = sum("straggler: node" in line for line in judged)
        touched += excluded
        intervals += len(judged)
        print(
            f"run {k}: exits {codes}, job lines naming a straggler: {named}, the policy's judged intervals: "
            f"{len(judged)}, naming a straggler: {by_policy}, excluded: {excluded}",
            flush=True,
        )
    print(f"balanced: {touched} of {args.runs} runs had a node taken out ({intervals} judged intervals)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=("exclude", "balanced"), default="exclude")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--interval-s", type=float, default=0.5)
    p.add_argument("--grace-s", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--slow-from", type=int, default=50)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--tolerance", type=float, default=0.2, help="the earlier pace, within this share")
    p.add_argument("--timeout-s", type=float, default=180.0)
    p.add_argument("--keep", help="a directory: keep each run's logs there")
    p.add_argument("--launcher-args", default="", help="more options for every launcher (one string)")
    args = p.parse_args()
    if args.scenario == "balanced":
        balanced_runs(args)
        return
    results = []
    for k in range(args.runs):
        r = excluded_run(args, k)
        results.append(r)
        print(f"run {k}: " + ", ".join(f"{key} {v:.2f}" for key, v in r.items()), flush=True)
    print("median: " + ", ".join(f"{key} {statistics.median(r[key] for r in results):.2f}" for key in results[0]))


if __name__ == "__main__":
    main()
