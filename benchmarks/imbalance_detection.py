"""How reliably per-step imbalance is told from a fixed straggler and from a balanced run (CPU, gloo).

Real launches of tests/telemetry_workers/variance_loop.py (DDP, no openclaw code): ``variance``
(every step one rank drawn at random gets a batch ``--costly-pct`` % more costly; each run another
seed), ``control`` (rank 1 gets it at every step) and ``balanced`` (no costly batch). A variance run
is right when the report has ``step_imbalance.variance`` and names no straggler; a control run when
rank 1 is the straggler and ``variance`` is false; a balanced run when it has neither. Prints a
table (with the measured cost per step) and writes JSON.

    python benchmarks/imbalance_detection.py --runs 5 --ranks 2 4 --out benchmarks/results/imbalance.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "tests" / "telemetry_workers" / "variance_loop.py"
CASES = {"variance": (), "control": ("--fixed-rank", "1"), "balanced": ("--costly-pct", "0")}


def launch(ranks: int, *args: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "run.json"
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", str(ranks), "--console-ranks", "none"]
            + ["--report", str(report), str(LOOP), *args],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise SystemExit(f"launch failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return dict(json.loads(report.read_text()))


def right(case: str, report: dict[str, Any]) -> bool:
    named = [s["rank"] for s in report["stragglers"]]
    variance = bool((report.get("step_imbalance") or {}).get("variance"))
    if case == "variance":
        return variance and not named
    if case == "control":
        return named == [1] and not variance
    return not named and not variance


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--costly-pct", default="60")
    p.add_argument("--out")
    args = p.parse_args()
    rows = []
    for ranks in args.ranks:
        for case, extra in CASES.items():
            results = []
            for run in range(args.runs):
                cost = () if case == "balanced" else ("--costly-pct", args.costly_pct)
                report = launch(ranks, "--steps", str(args.steps), "--seed", str(run + 1), *cost, *extra)
                imb = report.get("step_imbalance") or {}
                results.append(
                    {
                        "right": right(case, report),
                        "stragglers": [s["rank"] for s in report["stragglers"]],
                        "variance": imb.get("variance"),
                        "cost_pct": imb.get("cost_pct"),
                        "cost_s": imb.get("cost_s"),
                        "top_share": max((imb.get("slowest_share") or {"-": 0.0}).values()),
                    }
                )
            rows.append({"ranks": ranks, "case": case, "runs": results})
            ok = sum(r["right"] for r in results)
            costs = [r["cost_pct"] for r in results if r["cost_pct"] is not None]
            cost = f"{statistics.median(costs):.1f} %" if costs else "-"
            print(f"{ranks} ranks  {case:<9} right {ok}/{len(results)}  median cost {cost}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"costly_pct": args.costly_pct, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
