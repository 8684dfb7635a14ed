"""One statistics line (issue 31 item 6): a job whose ranks made fewer steps than the warm-up counts
them in the table and says so on the statistics line, never "no steps seen" beside "steps 2"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from guards import GUARD_S

from openclaw_launch.stats.collect import WARMUP_STEPS


def summary(tmp: Path, steps: int) -> str:
    script = tmp / "train.py"
    script.write_text(f"from openclaw_launch import telemetry\nfor _ in range({steps}):\n    telemetry.step()\n")
    command = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "cpu", "--nproc_per_node", "1"]
    proc = subprocess.run([*command, str(script)], capture_output=True, text=True, timeout=GUARD_S, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_steps_below_the_warm_up_are_one_statement(tmp_path: Path) -> None:
    text = summary(tmp_path, WARMUP_STEPS - 1)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("0 "))
    assert f" {WARMUP_STEPS - 1} " in row  # the table's steps column
    assert "no steps seen" not in text
    assert f"statistics: {WARMUP_STEPS - 1} step(s) seen, none timed" in text


def test_no_step_at_all_says_so(tmp_path: Path) -> None:
    text = summary(tmp_path, 0)
    assert "statistics: no steps seen" in text
