"""How reliably the verdict names a slowed rank and its phase, and what statistics cost (CPU, gloo).

Runs real launches of tests/telemetry_workers/sections.py (the two-line API: data / compute
sections), tests/telemetry_workers/nanogpt_loop.py (no code change: batches sliced from a tensor in
the loop, DDP) and examples/train.py (no code change, a DataLoader), each judged by the launcher
itself at ``--threshold-pct`` (the default, 5): a slowed run is right when the verdict names the
slowed rank and phase, a balanced run when it names nobody. The slowdown is also given as % of the
measured median step of the slowed runs. ``--live-runs N``: the live line (``--stats-interval-s``
``--live-interval-s``) on a slowdown of ``--live-pct`` % of the pace that starts mid-run: how many
lines before it name anybody, and which line after it first names the rank and phase. Prints a
table and writes JSON.

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


LOOP = ROOT / "tests" / "telemetry_workers" / "nanogpt_loop.py"


def launch(
    ranks: int, script: Path, *args: str, telemetry: str = "hooks", threshold: str = "5", launcher: tuple[str, ...] = ()
) -> tuple[dict, str, str]:
    """A run's report, stdout and stderr."""
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
                "--straggler-threshold-pct",
                threshold,
                *launcher,
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
            return {"stragglers": [{"rank": -1, "phase": f"run failed: exit {proc.returncode}"}]}, proc.stdout, ""
        return json.loads(report.read_text()), proc.stdout, proc.stderr


def top(report: dict) -> dict[str, object]:
    """The verdict of a run and the run's median step."""
    steps = [r["statistics"]["step_time_s"]["p50"] for r in report.get("ranks", ()) if r.get("statistics")]
    found = report["stragglers"]
    return {
        "rank": found[0]["rank"] if found else None,
        "phase": found[0]["phase"] if found else None,
        "section": found[0].get("section") if found else None,
        "excess_pct": found[0].get("excess_pct", 0.0) if found else 0.0,
        "step_ms": 1000 * statistics.median(steps) if steps else None,
    }


def correct(run: dict[str, object], want: tuple[int, str] | None) -> bool:
    if want is None:
        return run["rank"] is None
    return (run["rank"], run["phase"]) == want


def detection(args: argparse.Namespace) -> dict[str, object]:
    """Each case ``args.runs`` times: (name, phase, amount, unit), unit "ms" (a fixed time per step)
    or "pct" (sections.py's --slow-pct: that % of the run's own pace, a slowdown of exactly it)."""
    slow_rank = args.ranks - 1
    cases: list[tuple[str, str, float, str]] = [("balanced", "input", 0.0, "ms")]
    for ms in args.slowdowns_ms:
        cases += [(f"input +{ms:g} ms", "input", ms, "ms"), (f"compute +{ms:g} ms", "compute", ms, "ms")]
    for pct in args.slowdowns_pct:
        cases += [(f"input +{pct:g} % of pace", "input", pct, "pct"), (f"compute +{pct:g} %", "compute", pct, "pct")]
    if args.loop_slowdowns_ms:
        cases.append(("balanced in-loop", "host", 0.0, "ms"))
    cases += [(f"in-loop batch +{ms:g} ms", "host", ms, "ms") for ms in args.loop_slowdowns_ms]
    results: dict[str, object] = {}
    for name, phase, amount, unit in cases:
        runs = []
        for _ in range(args.runs):
            slowed = ("--slow-rank", str(slow_rank if amount else -1), f"--slow-{unit}", str(amount))
            if phase == "host":
                report, _, _ = launch(
                    args.ranks, LOOP, "--steps", str(args.steps), *slowed, threshold=str(args.threshold_pct)
                )
            else:
                report, _, _ = launch(
                    args.ranks, SECTIONS, "--steps", str(args.steps), "--step-ms", str(args.step_ms),
                    "--slow-phase", phase, *slowed, threshold=str(args.threshold_pct),
                )  # fmt: skip
            runs.append(top(report))
        want = (slow_rank, "input" if phase == "host" else phase) if amount else None
        step_ms = statistics.median(float(r["step_ms"]) for r in runs if r["step_ms"])  # type: ignore[arg-type]
        hits = sum(correct(r, want) for r in runs)
        # the injected time as % of the slowed runs' step: P % of the pace is P/(100+P) of the step
        of_step = 100 * amount / step_ms if unit == "ms" else 100 * amount / (100 + amount)
        results[name] = {"slowdown_pct_of_step": of_step, "unit": unit, "correct": hits, "runs": runs}
        named = sorted(round(float(r["excess_pct"]), 1) for r in runs if r["rank"] is not None)  # type: ignore[arg-type]
        print(
            f"{name:>22} ({of_step:4.2f} % of a {step_ms:.1f} ms step): {hits}/{args.runs} right "
            f"at {args.threshold_pct:g} %; named excess % {named}",
            flush=True,
        )
    return results


def live(args: argparse.Namespace) -> dict[str, object]:
    """The live line on a slowdown of ``--live-pct`` % of the pace (compute) on the last rank from the
    middle of the run: per run, the lines before the start that named anybody (false), and how many
    whole intervals after the start passed before a line named the rank and phase (1: the first
    interval that lies wholly after the start)."""
    slow_rank, start_step, steps = args.ranks - 1, args.live_steps // 2, args.live_steps
    runs = []
    for _ in range(args.live_runs):
        _, _, err = launch(
            args.ranks, SECTIONS, "--steps", str(steps), "--step-ms", str(args.step_ms), "--slow-phase", "compute",
            "--slow-rank", str(slow_rank), "--slow-pct", str(args.live_pct), "--slow-from-step", str(start_step),
            threshold=str(args.threshold_pct), launcher=("--stats-interval-s", str(args.live_interval_s)),
        )  # fmt: skip
        lines = [line for line in err.splitlines() if "openclaw-launch: stats:" in line]
        counts = [int(m.group(1)) if (m := re.search(r"(\d+) steps", line)) else 0 for line in lines]
        started = args.ranks * start_step  # the steps of all ranks when the slowdown starts
        false = sum("straggler: rank" in line for line, n in zip(lines, counts, strict=True) if n <= started)
        after = [line for line, n in zip(lines, counts, strict=True) if n > started][1:]  # whole intervals
        named = next((i + 1 for i, line in enumerate(after) if f"straggler: rank {slow_rank} (compute" in line), None)
        runs.append({"false_before": false, "named_in_interval": named, "intervals_after": len(after)})
    within_one = sum(r["named_in_interval"] == 1 for r in runs)
    false_runs = sum(bool(r["false_before"]) for r in runs)
    print(
        f"{'live line':>22} (+{args.live_pct:g} % of pace from step {start_step}, "
        f"interval {args.live_interval_s:g} s): "
        f"named in the first whole interval {within_one}/{args.live_runs}, runs with a line naming anybody "
        f"before it {false_runs}/{args.live_runs}; per run {[r['named_in_interval'] for r in runs]}",
        flush=True,
    )
    return {"pct": args.live_pct, "interval_s": args.live_interval_s, "within_one_interval": within_one, "runs": runs}


def no_code_change(args: argparse.Namespace) -> dict[str, object]:
    runs = []
    for _ in range(args.no_code_change_runs):
        report, _, _ = launch(args.ranks, EXAMPLE, "--steps", "60", "--straggler-rank", "1", "--straggler-ms", "5")
        runs.append(top(report))
    hits = sum(correct(r, (1, "input")) for r in runs)
    print(
        f"{'no code change':>22}: {hits}/{args.no_code_change_runs} right (DataLoader 5 ms slower on rank 1)",
        flush=True,
    )
    return {"correct_at_5pct": hits, "runs": runs}


def overhead(args: argparse.Namespace) -> dict[str, object]:
    """Median step time of the example with statistics on (hooks) and off, interleaved."""
    times: dict[str, list[float]] = {"hooks": [], "off": []}
    for _ in range(args.overhead_reps):
        for mode in ("hooks", "off"):
            _, out, _ = launch(
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
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--slowdowns-ms", type=float, nargs="*", default=[1.4])
    p.add_argument("--slowdowns-pct", type=float, nargs="*", default=[], help="of the run's own pace")
    p.add_argument("--loop-slowdowns-ms", type=float, nargs="*", default=[1.0])
    p.add_argument("--threshold-pct", type=float, default=5.0)
    p.add_argument("--no-code-change-runs", type=int, default=0)
    p.add_argument("--overhead-reps", type=int, default=0)
    p.add_argument("--live-runs", type=int, default=0)
    p.add_argument("--live-pct", type=float, default=5.0)
    p.add_argument("--live-interval-s", type=float, default=5.0)
    p.add_argument("--live-steps", type=int, default=1000)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    started = time.time()
    result = {
        "machine": "2-core CPU box (gloo)",
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "ranks": args.ranks,
        "load_average_at_start": os.getloadavg(),
        "step_ms": args.step_ms,
        "detection": detection(args) if args.runs else None,
        "live": live(args) if args.live_runs else None,
        "no_code_change": no_code_change(args) if args.no_code_change_runs else None,
        "overhead": overhead(args) if args.overhead_reps else None,
    }
    result["elapsed_s"] = round(time.time() - started, 1)
    result["load_average_at_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
