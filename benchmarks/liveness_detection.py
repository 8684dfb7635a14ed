"""How soon issue 32's two silent failures are named, on one host (loopback "nodes"):

- ``frozen``: an elastic ``--nnodes 1:2`` job (tests/elastic_worker.py, gloo) runs in a world of two;
  the second node's launcher alone is SIGSTOPped (its agent helper and its rank run on, as with a
  launcher wedged in a call). ``detect_s``: the stop -> the first node's "is lost (no keep-alive"
  line. Goal: at most ``--keepalive-s`` + 1 s. (torchrun is not measured: a frozen torchrun agent's
  workers run on and its peers are never told; its rendezvous sees the agent only at the next round.)
- ``exit``: two ranks (tests/telemetry_workers/exit_hang.py, no torch); rank 1 registers a C exit
  handler that never returns and exits: its final batch comes, its process stays. ``detect_s``:
  its "DONE" (when it returned from the script) -> the launcher's "hang:" line. Goal: at most
  ``--hang-timeout-s`` + 2 s.

``python benchmarks/liveness_detection.py [--scenario frozen|exit] [--runs N] [--bound-s S]`` prints
one line per run and the median (``--bound-s``: the keep-alive or the hang timeout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
ELASTIC_WORKER = str(ROOT / "tests" / "elastic_worker.py")
EXIT_WORKER = str(ROOT / "tests" / "telemetry_workers" / "exit_hang.py")
TIMEOUT_S = 120.0


def _env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    return environ


class Lines:
    """A process's stderr, each line with the wall time it arrived."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        assert proc.stderr is not None
        self._thread = threading.Thread(target=self._pump, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, text: str, until: float) -> float | None:
        while time.monotonic() < until:
            for at, line in list(self.lines):
                if text in line:
                    return at
            time.sleep(0.01)
        return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def frozen(keepalive_s: float) -> float | None:
    port = _free_port()
    line = [sys.executable, "-m", "openclaw_launch", "--nnodes", "1:2", "--nproc-per-node", "1"]
    line += ["--rdzv-backend", "c10d", "--rdzv-id", "bench", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    line += ["--rdzv-conf", "last_call_timeout=30", "--max-restarts", "3", "--keepalive-s", f"{keepalive_s:g}"]
    work = [ELASTIC_WORKER, "--first-steps", "100000"]
    with tempfile.TemporaryDirectory() as tmp:
        out_b = Path(tmp) / "b.out"
        first = subprocess.Popen(
            [*line, *work], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        lines = Lines(first)
        time.sleep(1.0)
        with out_b.open("w") as out:
            second = subprocess.Popen([*line, *work], env=_env(), stdout=out, stderr=subprocess.DEVNULL, text=True)
        until = time.monotonic() + TIMEOUT_S
        while "size 2" not in out_b.read_text() and time.monotonic() < until:
            time.sleep(0.05)
        everything = [second.pid, *(c.pid for c in psutil.Process(second.pid).children(recursive=True))]
        stopped = time.time()
        os.kill(second.pid, signal.SIGSTOP)
        seen = lines.first("is lost (no keep-alive", time.monotonic() + keepalive_s + 30)
        for pid in everything + [first.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        first.wait()
        second.wait()
    return None if seen is None else seen - stopped


def exit_hang(hang_timeout_s: float) -> float | None:
    cmd = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", "--hang-timeout-s", f"{hang_timeout_s:g}"]
    cmd += ["--grace-period-s", "2", EXIT_WORKER, "--mode", "c-exit"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = Lines(proc)
    done: list[float] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "DONE" in line:
                done.append(float(line.split()[-1]))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    seen = lines.first("openclaw-launch: hang: no step", time.monotonic() + TIMEOUT_S)
    proc.wait(TIMEOUT_S)
    reader.join(5)
    return None if seen is None or not done else seen - done[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=("frozen", "exit"), default="frozen")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--bound-s", type=float, default=2.0)
    args = p.parse_args()
    run = frozen if args.scenario == "frozen" else exit_hang
    goal = args.bound_s + (1.0 if args.scenario == "frozen" else 2.0)
    got: list[float] = []
    for i in range(args.runs):
        took = run(args.bound_s)
        print(f"run {i + 1}: detect_s {'-' if took is None else f'{took:.2f}'} (goal <= {goal:g})", flush=True)
        if took is not None:
            got.append(took)
    if got:
        print(f"{args.scenario} bound {args.bound_s:g} s: median {statistics.median(got):.2f} s, max {max(got):.2f} s")


if __name__ == "__main__":
    main()
