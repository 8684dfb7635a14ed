"""``openclaw-launch report RUN.json --plot out.png``: a hand-built schema-2 report is drawn to a PNG;
a report without step statistics and an unwritable path are one clean error each (exit 2, in this
process: tests/cli_runner.py; the missing matplotlib through the real entry point)."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import Invocation, invoke
from guards import GUARD_S

from openclaw_launch.codec import to_json
from openclaw_launch.report.rank import SectionTimes, StepStatistics, StepTimes
from openclaw_launch.stats.result import Straggler
from tests.report_samples import node_report, rank_entry, step_statistics

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _stats(input_ms: float, work_ms: float, wait_ms: float) -> StepStatistics:
    """A rank whose step has an input stage, forward + optimizer work, and a waiting backward (DDP)."""
    step = (input_ms + work_ms + wait_ms) / 1000
    sections = {"input": input_ms, "forward": work_ms * 0.4, "optimizer": work_ms * 0.6, "backward": wait_ms}
    return dataclasses.replace(
        step_statistics(input_ms, work_ms, wait_ms),
        step_source="optimizer",
        step_time_s=StepTimes(p50=step, p90=step * 1.2, p99=step * 1.5, max=step * 1.6, mean=step * 1.05),
        sections={
            name: SectionTimes(p50=ms / 1000, p90=ms / 800, mean=ms / 1000, share=ms / 1000 / step)
            for name, ms in sections.items()
        },
        sync_sections=("backward",),
    )


def _report(ranks_stats: list[StepStatistics | None], stragglers: list[Straggler]) -> dict[str, Any]:
    """Two ranks per node, as ``run --report`` writes it."""
    ranks = tuple(rank_entry(i, f"node{i // 2}", s) for i, s in enumerate(ranks_stats))
    report = node_report("node0", world_size=len(ranks), ranks=ranks, stragglers=tuple(stragglers))
    return dict(to_json(report))


STRAGGLER = Straggler(
    rank=2,
    node="node1",
    phase="input",
    section="input",
    excess_s=0.010,
    excess_pct=76.9,
    busy_s=0.013,
    peers_busy_s=0.003,
    peers_wait_s=0.010,
    wait_source="cpu-phases",
    hints=("input pipeline: 80 % of its step waiting for data",),
)


def saved(tmp_path: Path, report: dict[str, Any]) -> Path:
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(report))
    return run_json


def report_plot(
    tmp_path: Path, report: dict[str, Any], out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "report", str(saved(tmp_path, report)), "--plot", str(out)],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env=env,
    )


def refused_plot(tmp_path: Path, report: dict[str, Any], out: Path) -> Invocation:
    """A plot expected to be refused, in this process."""
    return invoke("report", str(saved(tmp_path, report)), "--plot", str(out))


def test_plot_writes_a_png(tmp_path: Path) -> None:
    stats = [_stats(0.2, 2.8, 10.0), _stats(0.3, 2.7, 10.0), _stats(10.2, 2.8, 0.0), _stats(0.2, 2.9, 9.9)]
    out = tmp_path / "run.png"
    proc = report_plot(tmp_path, _report(stats, [STRAGGLER]), out)
    assert proc.returncode == 0, proc.stderr
    assert "straggler: rank 2" in proc.stdout  # the table is still printed
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert 600 <= width <= 3000 and 200 <= height <= 3000
    assert 5_000 < len(data) < 2_000_000


def test_a_schema_2_report_still_plots(tmp_path: Path) -> None:
    """Written before the keys of schema 3 existed (containment, history, hang, ...)."""
    old = _report([_stats(0.2, 2.8, 10.0), _stats(10.2, 2.8, 0.0)], [])
    old["schema"] = "openclaw-report/2"
    for key in ("attempt_history", "console_dropped_lines", "containment", "guardian_lost", "hang", "preflight"):
        del old[key]
    out = tmp_path / "run.png"
    proc = report_plot(tmp_path, old, out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_plot_without_straggler(tmp_path: Path) -> None:
    out = tmp_path / "run.png"
    proc = report_plot(tmp_path, _report([_stats(0.2, 2.8, 1.0), _stats(0.2, 2.8, 1.0)], []), out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes().startswith(PNG_SIGNATURE)


def test_report_without_statistics_is_a_clean_error(tmp_path: Path) -> None:
    out = tmp_path / "run.png"
    proc = refused_plot(tmp_path, _report([None, None], []), out)
    assert proc.returncode == 2
    assert "no step statistics" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()


def test_unwritable_path_is_a_clean_error(tmp_path: Path) -> None:
    parent = tmp_path / "a-file"  # a path under a regular file: unwritable even for root
    parent.write_text("")
    proc = refused_plot(tmp_path, _report([_stats(0.2, 2.8, 1.0)], []), parent / "run.png")
    assert proc.returncode == 2
    assert "cannot write plot" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_directory_is_a_clean_error(tmp_path: Path) -> None:
    proc = refused_plot(tmp_path, _report([_stats(0.2, 2.8, 1.0)], []), tmp_path / "no" / "such" / "run.png")
    assert proc.returncode == 2
    assert "cannot write plot" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "matplotlib"  # a matplotlib that cannot be imported
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")])),
    }
    proc = report_plot(tmp_path, _report([_stats(0.2, 2.8, 1.0)], []), tmp_path / "run.png", env=env)
    assert proc.returncode == 2
    assert "pip install 'openclaw-launch[plot]'" in proc.stderr
    assert "Traceback" not in proc.stderr
