"""The verdict's floor on FSDP2 and on a pipeline (issue 27), CPU with gloo: how often a slowed rank
is named with the right phase, and how often a balanced run names anybody.

Real launches of tests/telemetry_workers/fsdp2_loop.py (``fully_shard`` per block, ``--nproc``
ranks, rank ``--slow-rank``'s forward doing ``--fsdp-pct`` % more work) and
tests/telemetry_workers/pipeline_loop.py (``--nproc`` stages, 1F1B, stage ``--slow-rank`` with
``--pp-extra-layers`` more layers than the others' ``--pp-layers``), each judged by the launcher
itself at the default threshold (5 %), balanced and slowed runs interleaved. The slowdown is the
slowed runs' median step over the balanced runs' (what the slowed rank costs the job), and the
median of each slowed run's over the balanced run's just before it. ``--pace-pct P`` (FSDP2: in its
forward) and ``--pp-pace-pct P`` (the pipeline: after each micro-batch's forward) instead add matmuls
for P % of the pace the worker measures as it runs, as benchmarks/straggler_detection.py's
``--slowdowns-pct`` does for DDP: the same added share however the host's load moves the step.
``--pp-work-pct P``: the heavy stage adds P % of its own work instead (its step less its time in the
point-to-point calls): a stage with P % more work than the others, what the verdict compares stages
by (stats/pipeline.py). Each run also gives its largest own-work excess (``own_excess_pct``: a rank's
step less its wait phases, over the other ranks' median, from the report's means: % of that median,
% of the step), balanced or not.
``--numa-binding exclusive`` gives each CPU rank a core of its own (numactl), so that ranks that
compute at the same time do not share one: with no more ranks than cores, as on a GPU host.

    python benchmarks/straggler_parallel.py --runs 10 --out benchmarks/results/X.json
    python benchmarks/straggler_parallel.py --runs 10 --nproc 2 --slow-rank 0 --numa-binding exclusive \
        --pace-pct 5 --pp-pace-pct 5 --fsdp-batch 2048 --fsdp-steps 100 --pp-layers 16 --pp-width 384 --pp-batch 256 \
        --pp-steps 100
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


def launch(launcher: list[str], script: str, *args: str) -> dict[str, Any] | None:
    """A run's report; None (and its stderr's tail printed) when the run failed."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "run.json"
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_launch", *launcher, "--report", str(report)]
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


def own_excess_pct(report: dict[str, Any]) -> tuple[int, float, float]:
    """The rank with the most own work (its mean step less its wait phases), and by how much: % of the
    other ranks' median, and % of its step (what the verdict compared a pipeline stage with before)."""
    stats = {r["rank"]: r["statistics"] for r in report["ranks"]}
    own = {k: s["step_time_s"]["mean"] - s["sync_sections_s"] for k, s in stats.items()}
    rank = max(own, key=lambda k: own[k])
    others = statistics.median(v for k, v in own.items() if k != rank)
    step_s = stats[rank]["step_time_s"]["mean"]
    return rank, round(100 * (own[rank] / others - 1), 1), round(100 * (own[rank] - others) / step_s, 1)


def median_step_s(report: dict[str, Any]) -> float:
    return statistics.median(r["statistics"]["step_time_s"]["p50"] for r in report["ranks"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--nproc", type=int, default=4, help="ranks (FSDP2) and stages (pipeline)")
    p.add_argument("--slow-rank", type=int, default=2, help="the slowed rank, or the heavy stage")
    p.add_argument("--numa-binding", choices=("none", "exclusive"), default="none")
    p.add_argument("--fsdp-pct", type=float, default=20.0)
    p.add_argument("--pace-pct", type=float, help="instead: the slowed rank adds this % of the pace")
    p.add_argument("--fsdp-steps", type=int, default=80)
    p.add_argument("--fsdp-batch", type=int, default=512)
    p.add_argument("--pp-layers", type=int, default=8)
    p.add_argument("--pp-extra-layers", type=int, default=1)
    p.add_argument("--pp-pace-pct", type=float, help="instead: the heavy stage adds this % of the pace")
    p.add_argument("--pp-work-pct", type=float, help="instead: the heavy stage adds this % of its own work")
    p.add_argument("--pp-steps", type=int, default=60)
    p.add_argument("--pp-width", type=int, default=256)
    p.add_argument("--pp-batch", type=int, default=128)
    p.add_argument("--cases", nargs="+", default=["fsdp2", "pipeline"])
    p.add_argument("--out")
    args = p.parse_args()
    slow_rank = args.slow_rank
    launcher = ["--nproc-per-node", str(args.nproc)]
    if args.numa_binding != "none":
        launcher += ["--numa-binding", args.numa_binding]
    fsdp_slow = ["--slow-pct", str(args.fsdp_pct)] if args.pace_pct is None else ["--slow-pace-pct", str(args.pace_pct)]
    pp_slow = ["--heavy-extra-layers", str(args.pp_extra_layers)]
    if args.pp_pace_pct is not None:
        pp_slow = ["--heavy-pace-pct", str(args.pp_pace_pct)]
    if args.pp_work_pct is not None:
        pp_slow = ["--heavy-work-pct", str(args.pp_work_pct)]
    cases = {
        "fsdp2": (
            "fsdp2_loop.py",
            ["--steps", str(args.fsdp_steps), "--batch", str(args.fsdp_batch)],
            ["--slow-rank", str(slow_rank), *fsdp_slow],
            lambda s: s["rank"] == slow_rank and s["section"] == "forward",
        ),
        "pipeline": (
            "pipeline_loop.py",
            ["--steps", str(args.pp_steps), "--layers", str(args.pp_layers)]
            + ["--width", str(args.pp_width), "--batch", str(args.pp_batch)],
            ["--heavy-stage", str(slow_rank), *pp_slow],
            lambda s: s["rank"] == slow_rank and any(h.startswith(f"pipeline: rank {slow_rank}") for h in s["hints"]),
        ),
    }
    results: dict[str, Any] = {}
    for name in args.cases:
        script, base, slow, right = cases[name]
        balanced: list[dict[str, Any]] = []
        slowed: list[dict[str, Any]] = []
        ratios: list[float] = []  # each slowed run's step over the balanced run's just before it
        failed = 0
        for _ in range(args.runs):
            pair = [launch(launcher, script, *base, *extra) for extra in ((), slow)]
            failed += pair.count(None)
            for runs, report in zip((balanced, slowed), pair, strict=True):
                if report is not None:
                    runs.append(report)
            if pair[0] is not None and pair[1] is not None:
                ratios.append(median_step_s(pair[1]) / median_step_s(pair[0]))
        pace = statistics.median(median_step_s(r) for r in balanced)
        cost = statistics.median(median_step_s(r) for r in slowed) / pace - 1
        paired = statistics.median(ratios) - 1  # the box's load moves the two runs of a pair alike
        named = [r["stragglers"][0] for r in slowed if len(r["stragglers"]) == 1 and right(r["stragglers"][0])]
        false = [r["stragglers"] for r in balanced if r["stragglers"]]
        results[name] = {
            "slowdown_pct_of_step": round(100 * cost, 1),
            "slowdown_paired_pct": round(100 * paired, 1),
            "named_right": f"{len(named)}/{len(slowed)}",
            "named_excess_pct": [round(s["excess_pct"], 1) for s in named],
            "named_pct_of": sorted({s.get("pct_of", "step") for s in named}),
            "balanced_own_excess_pct": [own_excess_pct(r) for r in balanced],
            "slowed_own_excess_pct": [own_excess_pct(r) for r in slowed],
            "balanced_false": f"{len(false)}/{len(balanced)}",
            "balanced_named": [_named(f) for f in false],
            "slowed_named": [_named(r["stragglers"]) for r in slowed],
            "failed_runs": failed,
            "balanced_median_step_ms": round(1000 * pace, 1),
            "args": [*launcher, *base, *slow],
        }
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
