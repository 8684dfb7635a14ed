"""A ``--report`` on a full disk is found before the job (issue 32 item 9): the check writes some
bytes, not only an empty file (which a full filesystem still creates). A real tmpfs, filled; skipped
where this host cannot mount one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.files import check_output_path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def full_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with contextlib.suppress(OSError), open(where / "filler", "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.serial
def test_a_report_on_a_full_disk_is_exit_2_before_anything_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with full_tmpfs(tmp_path / "full") as full:
        report = full / "report.json"
        problem = check_output_path(report)
        assert problem is not None and "No space left" in problem
        cmd = [sys.executable, "-m", "openclaw_launch", "--report", str(report), "--no-python", "touch", str(marker)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=GUARD_S, env=env, cwd=ROOT)
        assert proc.returncode == 2, proc.stderr
        assert "--report" in proc.stderr and "No space left" in proc.stderr and "Traceback" not in proc.stderr
        assert not marker.exists() and not list(full.glob(".report.json.check.*"))


def test_a_writable_place_passes_and_leaves_nothing(tmp_path: Path) -> None:
    assert check_output_path(tmp_path / "r.json") is None
    assert list(tmp_path.iterdir()) == []
