"""The same torchrun command line under torchrun and openclaw-launch: wall time from exec to exit
of a 2-worker job whose workers only dump their variables (medians of N runs), as JSON on stdout.

    PYTHONPATH=. python benchmarks/torchrun_cmdline.py [--runs 5]
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
ARGS = ["--standalone", "--nproc_per_node=2", str(ROOT / "tests" / "compat_worker.py"), "--dump"]


def once(launcher: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        subprocess.run([*launcher, *ARGS, out], check=True, capture_output=True, cwd=ROOT)
        return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    runs = p.parse_args().runs
    launchers = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        "openclaw-launch": [sys.executable, "-m", "openclaw_launch"],
    }
    result = {name: [round(once(cmd), 3) for _ in range(runs)] for name, cmd in launchers.items()}
    summary = {name: {"runs_s": times, "median_s": statistics.median(times)} for name, times in result.items()}
    print(json.dumps({"command": " ".join(ARGS[:2]) + " WORKER", "results": summary}, indent=2))


if __name__ == "__main__":
    main()
