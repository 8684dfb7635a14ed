"""``--virtual-local-rank`` keeps every rank's statistics (issue 27 item 7): torchrun's flag sets
LOCAL_RANK=0 in every worker, and the workers used to pick their statistics socket by it, so rank 1's
went to rank 0's socket and were dropped as a stranger's. Real launcher, two gloo ranks, a script
with no openclaw code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from guards import GUARD_S
from host import needs_torch

ROOT = Path(__file__).resolve().parent.parent
NANOGPT = str(ROOT / "tests" / "telemetry_workers" / "nanogpt_loop.py")


@needs_torch
def test_every_rank_keeps_its_statistics_under_virtual_local_rank(tmp_path: Path) -> None:
    report_path = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", "--virtual-local-rank"]
        + ["--report", str(report_path), NANOGPT, "--steps", "12", "--step-sleep-ms", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ignored" not in proc.stderr
    report = json.loads(report_path.read_text())
    assert report["statistics"]["bad_datagrams"] == 0
    for rank in report["ranks"]:
        assert rank["statistics"] is not None, rank
        assert rank["statistics"]["steps"] >= 10, rank  # the user's 12 optimizer steps (issue 27 item 6 aside)
