"""How reliably the verdict names a slowed rank and its phase, and what statistics cost (CPU, gloo).

Runs real launches of tests/telemetry_workers/sections.py (the two-line API) and examples/train.py
(no code change, a DataLoader) with ``--straggler-threshold-pct 0``, so every run names its top
candidate with its excess; each threshold in ``--thresholds-pct`` is then applied to those numbers
(a balanced run is correct when its top excess stays below the threshold). The slowdown is given
as % of the measured median step. Prints a table and writes JSON.

    python benchmarks/straggler_detection.py --runs 10 --ranks 4 --out benchmarks/results/X.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ROOT / "tests" / "telemetry_workers" / "sections.py"
EXAMPLE = ROOT / "examples" / "train.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(ranks: int, script: Path, *args: str, telemetry: str = "hooks", threshold: str = "0") -> tuple[dict, str]:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "run.json"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "openclaw_launch",
                "--nproc-per-node",
                str(ranks),
                "--telemetry",
                telemetry,
                "--report",
                str(report),
                "--console-ranks",
                "0",
                str(script),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp,
        )
        if proc.returncode != 0:  # recorded as a failed run, not a verdict
            print(f"run failed ({proc.returncode}): {proc.stderr[-1500:]}", flush=True)
            return {"stragglers": [{"rank": -1, "phase": f"run failed: exit {proc.returncode}"}]}, proc.stdout
        return json.loads(report.read_text()), proc.stdout


def top(report: dict) -> dict[str, object]:  # type: ignore[type-arg]
    """The top candidate of a run (threshold 0) and the run's median step."""
    steps = [r["statistics"]["step_time_s"]["p50"] for r in report["ranks"] if r.get("statistics")]
    found = report["stragglers"]
    return {
        "rank": found[0]["rank"] if found else None,
        "phase": found[0]["phase"] if found else None,
        "excess_pct": found[0]["excess_pct"] if found else 0.0,
        "step_ms": 1000 * statistics.median(steps) if steps else None,
    }


def correct(run: dict[str, object], want: tuple[int, str] | None, threshold: float) -> bool:
    named = float(run["excess_pct"]) >= threshold  # type: ignore[arg-type]
    if want is None:
        return not named
    return named and (run["rank"], run["phase"]) == want


def detection(args: argparse.Namespace) -> dict[str, object]:
    slow_rank = args.ranks - 1
    cases: list[tuple[str, str, float]] = [("balanced", "input", 0.0)]
    for ms in args.slowdowns_ms:
        cases += [(f"input +{ms:g} ms", "input", ms), (f"compute +{ms:g} ms", "compute", ms)]
    results: dict[str, object] = {}
    for name, phase, slow_ms in cases:
        runs = []
        for _ in range(args.runs):
            report, _ = launch(
                args.ranks,
                SECTIONS,
                "--steps",
                str(args.steps),
                "--step-ms",
                str(args.step_ms),
                "--slow-rank",
                str(slow_rank if slow_ms else -1),
                "--slow-phase",
                phase,
                "--slow-ms",
                str(slow_ms),
            )
            runs.append(top(report))
        want = (slow_rank, phase) if slow_ms else None
        step_ms = statistics.median(float(r["step_ms"]) for r in runs if r["step_ms"])  # type: ignore[arg-type]
        scores = {f"{t:g}%": sum(correct(r, want, t) for r in runs) for t in args.thresholds_pct}
        results[name] = {"slowdown_pct_of_step": 100 * slow_ms / step_ms, "correct_at_threshold": scores, "runs": runs}
        excesses = sorted(round(float(r["excess_pct"]), 1) for r in runs)  # type: ignore[arg-type]
        print(
            f"{name:>16} ({100 * slow_ms / step_ms:4.1f} % of a {step_ms:.1f} ms step): correct {scores} of "
            f"{args.runs}; top excess % {excesses}",
            flush=True,
        )
    return results


def no_code_change(args: argparse.Namespace) -> dict[str, object]:
    runs = []
    for _ in range(args.runs):
        report, _ = launch(args.ranks, EXAMPLE, "--steps", "60", "--straggler-rank", "1", "--straggler-ms", "5")
        runs.append(top(report))
    hits = sum(correct(r, (1, "input"), 5.0) for r in runs)
    print(f"{'no code change':>16}: {hits}/{args.runs} correct at 5 % (DataLoader 5 ms slower on rank 1)", flush=True)
    return {"correct_at_5pct": hits, "runs": runs}


def overhead(args: argparse.Namespace) -> dict[str, object]:
    """Median step time of the example with statistics on (hooks) and off, interleaved."""
    times: dict[str, list[float]] = {"hooks": [], "off": []}
    for _ in range(args.overhead_reps):
        for mode in ("hooks", "off"):
            _, out = launch(
                args.ranks, EXAMPLE, "--steps", "300", "--hidden", "2048", "--batch-size", "256", telemetry=mode
            )
            times[mode].append(float(re.findall(r"median step ([0-9.]+) ms", out)[-1]))
    ratio = statistics.median(times["off"]) / statistics.median(times["hooks"])
    print(f"throughput with statistics / without: {ratio:.4f}  (median step ms {times})", flush=True)
    return {"throughput_ratio_on_over_off": ratio, "median_step_ms": times}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--slowdowns-ms", type=float, nargs="+", default=[2.0, 1.0])
    p.add_argument("--thresholds-pct", type=float, nargs="+", default=[3.0, 5.0])
    p.add_argument("--overhead-reps", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    started = time.time()
    result = {
        "machine": "2-core CPU box (gloo)",
        "date": time.strftime("%Y-%m-%d"),
        "ranks": args.ranks,
        "load_average_at_start": os.getloadavg(),
        "step_ms": args.step_ms,
        "detection": detection(args),
        "no_code_change": no_code_change(args),
        "overhead": overhead(args),
    }
    result["elapsed_s"] = round(time.time() - started, 1)
    result["load_average_at_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
