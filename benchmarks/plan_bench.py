"""Wall time of `openclaw-launch plan` for a config plus a snapshot, and proof it never imports torch.

  python benchmarks/plan_bench.py [--reps 20] [--config configs/h200x2.yaml --topology configs/h200x2.snapshot.json]

Prints the median and spread, the floor (`python -c pass`) measured in the same run, and whether any
torch module was imported (from `python -X importtime`). Goal (issue 2): under 300 ms on the 2-core box.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall_s(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--config", default="configs/h200x2.yaml")
    p.add_argument("--topology", default="configs/h200x2.snapshot.json")
    args = p.parse_args()
    plan = [
        sys.executable,
        "-m",
        "openclaw_launch",
        "plan",
        "--config",
        args.config,
        "--topology",
        args.topology,
    ]
    floor = [sys.executable, "-c", "pass"]
    wall_s(plan)  # warm the page cache
    runs: dict[str, list[float]] = {"plan": [], "python_floor": []}
    for _ in range(args.reps):
        runs["plan"].append(wall_s(plan))
        runs["python_floor"].append(wall_s(floor))
    imports = subprocess.run([sys.executable, "-X", "importtime", *plan[1:]], cwd=ROOT, capture_output=True, text=True)
    modules = [ln.rsplit("|", 1)[-1].strip() for ln in imports.stderr.splitlines() if "|" in ln]
    result = {
        name: {
            "median_ms": round(statistics.median(v) * 1000, 1),
            "min_ms": round(min(v) * 1000, 1),
            "max_ms": round(max(v) * 1000, 1),
        }
        for name, v in runs.items()
    }
    result["imports_torch"] = any(m == "torch" or m.startswith("torch.") for m in modules)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
