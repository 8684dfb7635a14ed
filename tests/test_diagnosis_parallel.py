"""The verdict on the trainings LLM teams run (issue 27 items 1-4 and 6), on CPU with real gloo
ranks and no openclaw code in the scripts: FSDP2 (waiting in its all-gathers and reduce-scatters),
a pipeline (waiting for the other stages in isend/irecv), gradient accumulation and nanoGPT's
batch fetched between forward and backward; step counts exactly the optimizer steps made. And no
launcher frame in a traceback through a hooked torch call (issue 31 item 5).

The slowdowns are large (60 % more forward work, a stage with 3x the layers, 4 ms per micro-batch)
so the verdict holds on a loaded 2-core host; the 5 % floor is measured in benchmarks/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from guards import GUARD_S

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "tests" / "telemetry_workers"


def run(
    tmp_path: Path, *args: str, nproc: int = 4, console: str = "none"
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """The launcher's options, then the worker script's name (under tests/telemetry_workers) and its."""
    report = tmp_path / "run.json"
    i = next(i for i, a in enumerate(args) if a.endswith(".py"))
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", str(nproc), "--report", str(report)]
        + ["--console-ranks", console, *args[:i], str(WORKERS / args[i]), *args[i + 1 :]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    return proc, json.loads(report.read_text()) if report.exists() else None


def _steps(report: Any) -> list[int]:
    return [r["statistics"]["steps"] for r in report["ranks"]]


@pytest.mark.parametrize("slow", [True, False])
def test_fsdp2_names_the_rank_with_more_forward_work_and_a_balanced_run_none(tmp_path: Path, slow: bool) -> None:
    """``fully_shard`` per block, 4 ranks: the all-gathers and reduce-scatters are waiting
    (``collective``), so rank 2's doubled forward work is its own and named in ``forward``. At a
    15 % threshold, as the balanced pipeline: four ranks on two cores contend for them unevenly (a
    balanced run was once named at +4.9 %, under a loaded CI run); the doubled work is far above it."""
    threshold = ("--straggler-threshold-pct", "15")
    slowed = ("--slow-rank", "2", "--slow-pct", "100") if slow else ()
    proc, report = run(tmp_path, *threshold, "fsdp2_loop.py", "--steps", "50", *slowed)
    assert proc.returncode == 0, proc.stderr
    assert _steps(report) == [50] * 4
    assert all("collective" in r["statistics"]["sync_sections"] for r in report["ranks"])
    if not slow:
        assert report["stragglers"] == [], report["stragglers"]
        return
    assert len(report["stragglers"]) == 1, [r["statistics"]["sections"] for r in report["ranks"]]
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"], s["section"]) == (2, "compute", "forward")


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_a_pipeline_names_its_heavy_stage_as_the_stage_that_bounds_it(tmp_path: Path, schedule: str) -> None:
    """Four stages, stage 2 with 3x the layers: the other stages wait for it in their isend/irecv
    (``p2p``), so it is named, with its share of the step, the bubble's and the layers to move."""
    proc, report = run(tmp_path, "pipeline_loop.py", "--schedule", schedule, "--heavy-stage", "2")
    assert proc.returncode == 0, proc.stderr
    assert _steps(report) == [40] * 4
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"]) == (2, "compute")
    [hint] = [h for h in s["hints"] if h.startswith("pipeline:")]
    assert hint.startswith("pipeline: rank 2, its pipeline stage, bounds the pipeline: its own work is ")
    assert "the bubble" in hint and "of its layers to the other stages" in hint
    assert "hint: pipeline: rank 2" in proc.stderr


def test_a_balanced_pipeline_names_no_stage(tmp_path: Path) -> None:
    """Balanced stages: none named (the p2p waits used to count as the last stage's host time: +25 %
    of the step, about 70 % of its own work). At a 25 % threshold, of a stage's own work (the verdict
    compares stages by it, stats/pipeline.py): four stages on two cores contend for them unevenly (the
    stages that compute at once share a core), the last stage's own time up to 12 % longer; the 5 %
    floor, with a core per stage, is in benchmarks/."""
    proc, report = run(tmp_path, "--straggler-threshold-pct", "25", "pipeline_loop.py")
    assert proc.returncode == 0, proc.stderr
    sections = [(r["statistics"]["sync_sections"], r["statistics"]["sections"]) for r in report["ranks"]]
    assert report["stragglers"] == [], (report["stragglers"], sections)
    assert all(sync == ["p2p"] for sync, _ in sections), sections


def test_accumulation_times_every_micro_batch_and_counts_optimizer_steps(tmp_path: Path) -> None:
    """4 micro-batches per step (DDP ``no_sync`` on the first 3), rank 2's forward 4 ms slower in
    each: 40 optimizer steps are 40 steps, and the 16 ms per step are named in ``forward``."""
    args = ("--accum", "4", "--steps", "40", "--slow-rank", "2", "--compute-ms", "4", "--step-sleep-ms", "3")
    proc, report = run(tmp_path, "nanogpt_loop.py", *args)
    assert proc.returncode == 0, proc.stderr
    assert _steps(report) == [40] * 4
    [s] = report["stragglers"]
    assert (s["rank"], s["section"]) == (2, "forward")
    assert s["excess_s"] == pytest.approx(0.016, abs=0.006)


def test_nanogpts_batch_fetched_between_forward_and_backward_is_input_host(tmp_path: Path) -> None:
    """karpathy/nanoGPT's order: forward, the next ``get_batch``, backward. Rank 1's fetch 8 ms slower
    is its input/host stage, not compute; 60 iterations are 60 steps."""
    proc, report = run(tmp_path, "nanogpt_loop.py", "--fetch-between", "--slow-rank", "1", "--slow-ms", "8")
    assert proc.returncode == 0, proc.stderr
    assert _steps(report) == [60] * 4
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"], s["section"]) == (1, "input", "host")


@pytest.mark.parametrize(
    ("mode", "last"),
    [
        ("backward", "RuntimeError: element 0 of tensors does not require grad"),
        ("all_reduce", "TypeError: Invalid function argument"),
        ("interrupt", "KeyboardInterrupt"),
    ],
)
def test_a_traceback_through_a_hooked_call_has_no_launcher_frame(tmp_path: Path, mode: str, last: str) -> None:
    proc, _ = run(tmp_path, "raises.py", "--mode", mode, nproc=2, console="0")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[rank 0]")]
    start = next(i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line)
    end = next(i for i, line in enumerate(lines) if i > start and last in line)
    trace = lines[start : end + 1]
    assert any("raises.py" in line for line in trace), trace
    assert not any("openclaw_launch" in line for line in trace), "\n".join(trace)
