"""Statistics through the whole launcher on real gloo workers: the straggler named with its phase,
with the API and with no code change, and the statistics in the report on every exit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = str(ROOT / "tests" / "telemetry_workers" / "sections.py")
EXAMPLE = str(ROOT / "examples" / "train.py")


def run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    report = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", "--report", str(report), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize("phase", ["input", "compute"])
def test_api_sections_name_the_slow_rank_and_phase(tmp_path: Path, phase: str) -> None:
    proc, report = run(tmp_path, SECTIONS, "--slow-rank", "1", "--slow-phase", phase, "--slow-ms", "12")
    assert proc.returncode == 0, proc.stderr
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"], s["node"]) == (1, phase, "localhost")
    assert s["section"] == ("input" if phase == "input" else "compute")
    assert report["statistics"]["wait_source"] == "cpu-phases"
    stats = report["ranks"][0]["statistics"]
    assert stats["steps"] == 40 and stats["step_source"] == "api"
    assert set(stats["sections"]) >= {"input", "compute", "sync", "other"} and stats["sync_sections"] == [
        "collective",
        "sync",
    ]
    assert "straggler: rank 1 on node localhost" in proc.stderr


def test_balanced_ranks_get_no_verdict(tmp_path: Path) -> None:
    proc, report = run(tmp_path, SECTIONS)
    assert proc.returncode == 0, proc.stderr
    assert report["stragglers"] == [] and "straggler: none" in proc.stderr


def test_no_code_change_names_a_slow_dataloader(tmp_path: Path) -> None:
    """The example uses no openclaw API: the DataLoader, DDP and optimizer hooks see it all."""
    proc, report = run(
        tmp_path, "--console-ranks", "none", EXAMPLE, "--steps", "40", "--straggler-rank", "1", "--straggler-ms", "10"
    )
    assert proc.returncode == 0, proc.stderr
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"]) == (1, "input")
    stats = report["ranks"][1]["statistics"]
    assert stats["step_source"] == "optimizer" and {"input", "forward", "backward", "optimizer"} <= set(
        stats["sections"]
    )
    assert "backward" in stats["sync_sections"]  # DDP all-reduces gradients inside backward


def test_statistics_survive_a_signal_and_telemetry_off_leaves_argv_alone(tmp_path: Path) -> None:
    report_path = tmp_path / "run.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "openclaw_launch",
            "--nproc-per-node",
            "2",
            "--report",
            str(report_path),
            SECTIONS,
            "--steps",
            "100000",
            "--ready-file",
            str(tmp_path / "ready-{rank}"),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def stepped() -> bool:  # 20 steps done on every rank
        assert proc.poll() is None, "the job ended before its ranks stepped"
        return all((tmp_path / f"ready-{r}").exists() for r in range(2))

    wait_for(stepped, "ranks never stepped", poll_s=0.1)
    time.sleep(1.5)  # at least one statistics batch sent (every 0.5 s at a step boundary)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 143, err
    report = json.loads(report_path.read_text())
    assert report["signal_received"] == "SIGTERM"
    assert all(r["statistics"]["steps"] > 10 for r in report["ranks"])
    rendered = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "report", str(report_path)],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert rendered.returncode == 0 and "p50_ms" in rendered.stdout and "straggler:" in rendered.stdout

    off = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "1", "--telemetry", "off", "--dry-run", SECTIONS],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert off.returncode == 0 and "bootstrap" not in off.stdout
    on = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "1", "--dry-run", SECTIONS],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert "openclaw_launch.telemetry.bootstrap" in on.stdout
