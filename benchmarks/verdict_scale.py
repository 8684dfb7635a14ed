"""The straggler verdict's and the step imbalance's cost against the ranks, this tree against a commit
before it (issue 29: the first node judges every rank of the job, live and at the job report's merge).

Synthetic rank summaries of a realistic shape, the same on both sides (seeded): a 100 ms step of
five phases (input, host, forward, backward, optimizer) and a wait (``sync``), each window's
medians with 2 % noise; one rank (the middle one) 8 ms slower in its forward, the others waiting
as much longer. Per rank count, each side in a process of its own (the older commit's package
extracted with ``git archive``, imported from there):

- ``verdict``: ``find_stragglers`` over every rank, ``--windows`` windows each (the live line's 24
  by default; the job report's summaries carry a whole attempt's, up to 1 024): the job report's
  straggler verdict, and the live line's when it judges every rank. ``balanced``: the same without
  the slow rank (nobody named: fewer keys compared).
- ``live``: node 0's live line (``stats/job_live.judge``) over nodes of 8 ranks: what each side's
  line judges (a commit that samples judges its sample).
- ``imbalance``: the job report's per-step imbalance: every rank's last ``--steps`` steps aligned
  and judged (``stats/imbalance.aligned(...).judge()``), per-batch noise of 10 %.

Timings are the median of ``--repeats`` runs (one run where it takes over 10 s), wall and CPU of
the process. The older side runs up to ``--old-max-ranks``; above, its time is extrapolated from
its own growth between the two largest counts it ran (said so). Each side prints what it named,
so that the same verdict on the same input is checked too.

    python benchmarks/verdict_scale.py --before 3e20ae0 --ranks 128,1024,8192 --out benchmarks/results/X.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = {"input": 0.004, "host": 0.002, "forward": 0.030, "backward": 0.040, "optimizer": 0.004}
STEP_S = 0.100
SLOW_S = 0.008  # the slow rank's extra forward: 8 % of the step
RANKS_PER_NODE = 8
LONG_S = 10.0  # a case that takes longer runs once


def summaries(n: int, windows: int, slow: bool) -> list[Any]:
    """``n`` ranks' summaries with ``windows`` windows; the middle rank slow when ``slow``."""
    from openclaw_launch.stats.collect import INPUT_STAGE, OWN, STEP, PhaseSummary, RankSummary

    rng = random.Random(n * 7919 + windows + slow)
    out = []
    for rank in range(n):
        extra = SLOW_S if slow and rank == n // 2 else 0.0
        rows = []
        for k in range(windows):
            row = {p: s * rng.gauss(1.0, 0.02) for p, s in PHASES.items()}
            row["forward"] += extra
            work = sum(row.values())
            row["sync"] = max(STEP_S + (SLOW_S if slow else 0.0) - work, 0.0005)
            row.update({STEP: work + row["sync"], OWN: work, INPUT_STAGE: row["input"] + row["host"]})
            rows.append((k, row))
        means = {p: statistics.fmean(w[p] for _, w in rows) for p in (*PHASES, "sync")}
        step = sum(means.values())
        phases = {p: PhaseSummary(m, m, m, m / step) for p, m in means.items()}
        steps = windows * 5
        out.append(
            RankSummary(
                rank,
                steps + 3,
                steps,
                step,
                step,
                step,
                step,
                step,
                phases,
                ("sync",),
                None,
                None,
                "optimizer",
                0,
                tuple(rows),
            )  # fmt: skip
        )
    return out


def rank_steps(n: int, steps: int) -> list[Any]:
    """Every rank's last ``steps`` aligned steps, each step's work with 10 % per-batch noise."""
    from openclaw_launch.stats.imbalance import RankSteps

    rng = random.Random(n * 31 + steps)
    out = []
    for rank in range(n):
        work = tuple(round(0.08 * rng.gauss(1.0, 0.1), 6) for _ in range(steps))
        out.append(RankSteps(rank, 3, tuple(round(w + 0.02, 6) for w in work), work, ()))
    return out


def timed(fn: Callable[[], Any], repeats: int) -> tuple[dict[str, float], Any]:
    """The median wall and CPU seconds of ``repeats`` calls (one when a call takes over LONG_S)."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        if walls[-1] > LONG_S:
            break
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "runs": len(walls)}, result


def worker(n: int, windows: int, steps: int, repeats: int) -> dict[str, Any]:
    """One side's timings at ``n`` ranks (in the process of the side's package)."""
    import openclaw_launch
    from openclaw_launch.stats import imbalance, job_live
    from openclaw_launch.stats.verdict import RankFacts, find_stragglers

    facts = {r: RankFacts(node=f"n{r // RANKS_PER_NODE}") for r in range(n)}
    out: dict[str, Any] = {"package": str(Path(openclaw_launch.__file__).parent)}

    def named(found: list[Any]) -> list[Any]:
        return [[s.rank, s.section, repr(s.excess_s)] for s in found]

    for case, slow in (("verdict", True), ("balanced", False)):
        ranks = summaries(n, windows, slow)
        times, found = timed(lambda ranks=ranks: find_stragglers(ranks, facts, 5.0), repeats)
        out[case] = {**times, "named": named(found)}
    live = summaries(n, job_live.LIVE_WINDOWS, True)
    nodes = [
        job_live.NodeInterval(f"n{k}", k, 1, tuple(live[k * RANKS_PER_NODE : (k + 1) * RANKS_PER_NODE]))
        for k in range(math.ceil(n / RANKS_PER_NODE))
    ]
    times, line = timed(lambda: job_live.judge(nodes, len(nodes), [], 5.0), repeats)
    out["live"] = {**times, "text": line.text}
    parts = rank_steps(n, steps)
    times, judged = timed(lambda: imbalance.aligned(parts, range(n)).judge(), repeats)
    out["imbalance"] = {**times, "judged": None if judged is None else [judged.steps, repr(judged.cost_s)]}
    return out


def side(package_root: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """A worker process importing ``openclaw_launch`` from ``package_root``."""
    command = [sys.executable, __file__, "--worker", str(n), "--windows", str(args.windows)]
    command += ["--steps", str(args.steps), "--repeats", str(args.repeats)]
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    done = subprocess.run(command, env=env, cwd=package_root, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the worker at {n} ranks under {package_root} failed:\n{done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    if Path(result["package"]).parent.resolve() != package_root.resolve():
        raise SystemExit(f"the worker imported {result['package']}, not the package under {package_root}")
    return result


def extrapolated(old: dict[int, dict[str, Any]], n: int, case: str) -> dict[str, Any]:
    """The older side's time at ``n`` from its growth between its two largest measured counts."""
    (n1, a), (n2, b) = sorted(old.items())[-2:]
    out: dict[str, Any] = {}
    for clock in ("wall_s", "cpu_s"):
        exponent = math.log(b[case][clock] / a[case][clock]) / math.log(n2 / n1)
        out[clock] = b[case][clock] * (n / n2) ** exponent
        out[f"{clock}_exponent"] = exponent
    out["extrapolated"] = f"from {n1} and {n2} ranks: CPU ~ n^{out['cpu_s_exponent']:.2f}"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="the commit to compare with (git rev)")
    p.add_argument("--ranks", default="128,1024,8192")
    p.add_argument("--windows", type=int, default=24, help="windows per rank for the verdict (live line: 24)")
    p.add_argument("--steps", type=int, default=1000, help="aligned steps per rank (the job report's 1000)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--old-max-ranks", type=int, default=1024)
    p.add_argument("--out")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.windows, args.steps, args.repeats)))
        return
    if not args.before:
        p.error("--before COMMIT is required (the commit to compare with)")
    counts = [int(n) for n in args.ranks.split(",")]
    results: dict[str, Any] = {"before": args.before, "windows": args.windows, "steps": args.steps, "ranks": {}}
    old: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.before, "openclaw_launch"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        for n in counts:
            new = side(ROOT, n, args)
            if n <= args.old_max_ranks:
                old[n] = side(Path(tmp), n, args)
                before: dict[str, Any] = old[n]
            elif len(old) >= 2:
                before = {c: extrapolated(old, n, c) for c in ("verdict", "balanced", "imbalance")}
            else:
                before = {}
            results["ranks"][n] = {"new": new, "old": before}
            for case in ("verdict", "balanced", "live", "imbalance"):
                print(_line(n, case, before.get(case), new[case]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


def _line(n: int, case: str, old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """One case: both sides' wall and CPU seconds, the ratio of CPU, whether the result is the same."""
    now = f"now {new['wall_s']:.3f} s wall, {new['cpu_s']:.3f} s CPU"
    result = new.get("named", new.get("text", new.get("judged")))
    if old is None:
        return f"{n} ranks {case}: {now}\n    now: {result}"
    was = f"before {old['wall_s']:.3f} s wall, {old['cpu_s']:.3f} s CPU"
    ratio = f"{old['cpu_s'] / new['cpu_s']:.1f}x less CPU"
    if "extrapolated" in old:
        return f"{n} ranks {case}: {was} (extrapolated {old['extrapolated']}); {now}; {ratio}\n    now: {result}"
    return f"{n} ranks {case}: {was}; {now}; {ratio}{_same(case, old, new)}\n    now: {result}"


def _same(case: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """Whether both sides found the same; of the live line, the same rank named (an older line that
    judged a sample of the ranks measures the excess against the sample's median)."""
    if case == "live":
        a, b = (re.search(r"straggler: node \S+ rank \d+|no straggler", x["text"]) for x in (old, new))
        same = a is not None and b is not None and a.group() == b.group()
        return "; the same rank named" if same else f"; DIFFERENT: before {old['text']}"
    key = {"verdict": "named", "balanced": "named", "imbalance": "judged"}[case]
    return "; the same result" if old[key] == new[key] else f"; DIFFERENT: before {old[key]}"


if __name__ == "__main__":
    main()
