"""Container numbers (issue 12): image size and build time on a cached base, and the time from
starting the job to its first worker running user code, in a container (podman run, the launcher
as PID 1) against the same job outside. Root, with tests/container/engine.sh's engine and bases.

    python benchmarks/container_start.py [--reps 5] [-o results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ["bash", str(ROOT / "tests" / "container" / "engine.sh")]
LIMITS = ["--ulimit", "nofile=10000:10000", "--ulimit", "nproc=30000:30000"]
# The worker writes its own wall-clock start (same clock inside and outside the container).
WORKER = "import os, sys, time; open(sys.argv[1] + os.environ['RANK'], 'w').write(repr(time.time()))"


def podman(*args: str) -> str:
    return subprocess.run([*ENGINE, "podman", *args], check=True, capture_output=True, text=True).stdout


def build(base: str, tag: str) -> float:
    with tempfile.TemporaryDirectory() as d:  # this machine's pip settings, mounted into the build
        pip = subprocess.run([*ENGINE, "pipconf", d], capture_output=True, text=True, check=True).stdout.split()
        t0 = time.monotonic()
        podman("build", "--layers=false", "--network", "host", *LIMITS, *pip,
               "--build-arg", f"BASE={base}", "-t", tag, str(ROOT))  # fmt: skip
        return time.monotonic() - t0


def first_worker_s(cmd: list[str], out: Path) -> float:
    for f in out.glob("start-*"):
        f.unlink()
    t0 = time.time()
    subprocess.run(cmd, check=True, capture_output=True)
    return min(float(f.read_text()) for f in out.glob("start-*")) - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("-o", "--output")
    args = p.parse_args()
    result: dict[str, object] = {}
    for base, tag in (
        ("openclaw-base:bookworm", "openclaw-bench:plain"),
        ("openclaw-base:bookworm-torch", "openclaw-bench:torch"),
    ):
        build_s = build(base, tag)
        size = json.loads(podman("image", "inspect", tag))[0]["Size"]
        base_size = json.loads(podman("image", "inspect", base))[0]["Size"]
        result[tag] = {"base": base, "build_s": round(build_s, 1), "size_mb": round(size / 1e6, 1),
                       "added_mb": round((size - base_size) / 1e6, 1)}  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        out = Path(d)
        opts = ["--nproc-per-node", "2", "--no-python", "--"]
        inside = [*ENGINE, "podman", "run", "--rm", "--network", "none", *LIMITS, "-v", f"{out}:/out",
                  "openclaw-bench:torch", *opts, "python3", "-c", WORKER, "/out/start-"]  # fmt: skip
        outside = [sys.executable, "-m", "openclaw_launch", *opts, sys.executable, "-c", WORKER, f"{out}/start-"]
        times: dict[str, list[float]] = {"container": [], "host": []}
        for _ in range(args.reps):
            times["container"].append(first_worker_s(inside, out))
            times["host"].append(first_worker_s(outside, out))
    for tag in ("openclaw-bench:plain", "openclaw-bench:torch"):
        podman("rmi", "-f", tag)
    result["start_to_first_worker_s"] = {
        k: {"median": round(statistics.median(v), 3), "runs": [round(x, 3) for x in v]} for k, v in times.items()
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
