"""How reliably the verdict names a slowed rank and its phase, and what statistics cost (CPU, gloo).

Runs real launches of tests/telemetry_workers/sections.py (the two-line API) and examples/train.py
(no code change, a DataLoader) and reads each run's report. Prints a table and writes JSON.

    python benchmarks/straggler_detection.py --runs 10 --ranks 4 --out benchmarks/results/X.json
"""

from __future__ import annotations

import argparse
import json
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


def launch(ranks: int, script: Path, *args: str, telemetry: str = "hooks") -> tuple[dict, str]:  # type: ignore[type-arg]
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


def verdict(report: dict) -> tuple[int, str] | None:  # type: ignore[type-arg]
    found = report["stragglers"]
    return (found[0]["rank"], found[0]["phase"]) if found else None


def detection(args: argparse.Namespace) -> dict[str, object]:
    slow_rank = args.ranks - 1
    cases: list[tuple[str, str, float]] = [("balanced", "input", 0.0)]
    for pct in args.slowdowns_pct:
        cases += [(f"input +{pct:g}%", "input", pct), (f"compute +{pct:g}%", "compute", pct)]
    results: dict[str, object] = {}
    for name, phase, pct in cases:
        hits, seen = 0, []
        for _ in range(args.runs):
            slow_ms = args.step_ms * pct / 100
            report, _ = launch(
                args.ranks,
                SECTIONS,
                "--steps",
                str(args.steps),
                "--step-ms",
                str(args.step_ms),
                "--slow-rank",
                str(slow_rank if pct else -1),
                "--slow-phase",
                phase,
                "--slow-ms",
                str(slow_ms),
            )
            got = verdict(report)
            seen.append(got)
            hits += got == ((slow_rank, phase) if pct else None)
        results[name] = {"correct": hits, "runs": args.runs, "verdicts": seen}
        print(f"{name:>16}: {hits}/{args.runs} correct  {seen}", flush=True)
    return results


def no_code_change(args: argparse.Namespace) -> dict[str, object]:
    hits, seen = 0, []
    for _ in range(args.runs):
        report, _ = launch(args.ranks, EXAMPLE, "--steps", "60", "--straggler-rank", "1", "--straggler-ms", "5")
        got = verdict(report)
        seen.append(got)
        hits += got == (1, "input")
    print(f"{'no code change':>16}: {hits}/{args.runs} correct (DataLoader 5 ms slower on rank 1)  {seen}", flush=True)
    return {"correct": hits, "runs": args.runs, "verdicts": seen}


def overhead(args: argparse.Namespace) -> dict[str, object]:
    """Median step time of the example with statistics on (hooks) and off, interleaved."""
    times: dict[str, list[float]] = {"hooks": [], "off": []}
    for _ in range(args.overhead_reps):
        for mode in ("hooks", "off"):
            _, out = launch(args.ranks, EXAMPLE, "--steps", "400", telemetry=mode)
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
    p.add_argument("--slowdowns-pct", type=float, nargs="+", default=[10.0, 5.0, 3.0])
    p.add_argument("--overhead-reps", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    started = time.time()
    result = {
        "machine": "2-core CPU box (gloo)",
        "date": time.strftime("%Y-%m-%d"),
        "ranks": args.ranks,
        "step_ms": args.step_ms,
        "detection": detection(args),
        "no_code_change": no_code_change(args),
        "overhead": overhead(args),
    }
    result["elapsed_s"] = round(time.time() - started, 1)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
