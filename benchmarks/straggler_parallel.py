"""The verdict's floor on FSDP2 and on a pipeline (issue 27), CPU with gloo: how often a slowed rank
is named with the right phase, and how often a balanced run names anybody.

Real launches of tests/telemetry_workers/fsdp2_loop.py (``fully_shard`` per block, 4 ranks, rank 2's
forward doing ``--fsdp-pct`` % more work) and tests/telemetry_workers/pipeline_loop.py (4 stages,
1F1B, stage 2 with ``--pp-extra-layers`` more layers than the others' ``--pp-layers``), each judged by
the launcher itself at the default threshold (5 %), balanced and slowed runs interleaved. The
slowdown is given as % of the balanced runs' median step (what the slowed rank costs the job).

    python benchmarks/straggler_parallel.py --runs 10 --out benchmarks/results/X.json
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
WORKERS = ROOT / "tests" / "telemetry_workers"


def launch(script: str, *args: str) -> dict[str, Any] | None:
    """A run's report; None (and its stderr's tail printed) when the run failed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "run.json"
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "4", "--report", str(report)]
            + ["--console-ranks", "none", str(WORKERS / script), *args],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            print(f"run failed ({proc.returncode}):", *proc.stderr.splitlines()[-12:], sep="\n  ", flush=True)
            return None
        return json.loads(report.read_text())  # type: ignore[no-any-return]


def _named(stragglers: list[dict[str, Any]]) -> list[tuple[int, str, float]]:
    return [(x["rank"], x["section"], round(x["excess_pct"], 1)) for x in stragglers]


def median_step_s(report: dict[str, Any]) -> float:
    return statistics.median(r["statistics"]["step_time_s"]["p50"] for r in report["ranks"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--fsdp-pct", type=float, default=20.0)
    p.add_argument("--fsdp-steps", type=int, default=80)
    p.add_argument("--pp-layers", type=int, default=8)
    p.add_argument("--pp-extra-layers", type=int, default=1)
    p.add_argument("--pp-steps", type=int, default=60)
    p.add_argument("--cases", nargs="+", default=["fsdp2", "pipeline"])
    p.add_argument("--out")
    args = p.parse_args()
    cases = {
        "fsdp2": (
            "fsdp2_loop.py",
            ["--steps", str(args.fsdp_steps)],
            ["--slow-rank", "2", "--slow-pct", str(args.fsdp_pct)],
            lambda s: s["rank"] == 2 and s["section"] == "forward",
        ),
        "pipeline": (
            "pipeline_loop.py",
            ["--steps", str(args.pp_steps), "--layers", str(args.pp_layers), "--width", "256", "--batch", "128"],
            ["--heavy-stage", "2", "--heavy-extra-layers", str(args.pp_extra_layers)],
            lambda s: s["rank"] == 2 and any(h.startswith("pipeline: rank 2") for h in s["hints"]),
        ),
    }
    results: dict[str, Any] = {}
    for name in args.cases:
        script, base, slow, right = cases[name]
        balanced: list[dict[str, Any]] = []
        slowed: list[dict[str, Any]] = []
        failed = 0
        for _ in range(args.runs):
            for runs, extra in ((balanced, ()), (slowed, slow)):
                report = launch(script, *base, *extra)
                if report is None:
                    failed += 1
                else:
                    runs.append(report)
        pace = statistics.median(median_step_s(r) for r in balanced)
        cost = statistics.median(median_step_s(r) for r in slowed) / pace - 1
        named = [r["stragglers"][0] for r in slowed if len(r["stragglers"]) == 1 and right(r["stragglers"][0])]
        false = [r["stragglers"] for r in balanced if r["stragglers"]]
        results[name] = {
            "slowdown_pct_of_step": round(100 * cost, 1),
            "named_right": f"{len(named)}/{len(slowed)}",
            "named_excess_pct": [round(s["excess_pct"], 1) for s in named],
            "balanced_false": f"{len(false)}/{len(balanced)}",
            "balanced_named": [_named(f) for f in false],
            "slowed_named": [_named(r["stragglers"]) for r in slowed],
            "failed_runs": failed,
            "balanced_median_step_ms": round(1000 * pace, 1),
            "args": slow,
        }
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
