"""The ``torchrun`` shim never runs a module of the current directory as the launcher (issue 32
item 9): a ``./openclaw_launch`` package in the job's directory is not what ``torchrun`` runs, with
``-P`` (Python 3.11+) or, on 3.10, the path cut by hand. Real shims in a scratch directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.cli.shim import install_shim, shim_text

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("safe_path", [True, False], ids=["-P", "by-hand"])
def test_the_shim_does_not_run_a_package_of_the_current_directory(tmp_path: Path, safe_path: bool) -> None:
    if safe_path and sys.version_info < (3, 11):
        pytest.skip("-P is Python 3.11's")
    bin_dir, job = tmp_path / "bin", tmp_path / "job"
    bin_dir.mkdir()
    fake = job / "openclaw_launch"
    fake.mkdir(parents=True)
    hit = tmp_path / "hijacked"
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(f"open({str(hit)!r}, 'w').write('ran')\n")
    install_shim(bin_dir, sys.executable, force=False)
    shim = bin_dir / "torchrun"
    shim.write_text(shim_text(sys.executable, safe_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([str(shim), "--help"], cwd=job, env=env, capture_output=True, text=True, timeout=GUARD_S)
    assert proc.returncode == 0, proc.stderr
    assert not hit.exists() and "Usage: openclaw-launch" in proc.stdout


def test_without_the_guard_the_current_directory_would_win(tmp_path: Path) -> None:
    """The hazard itself (why the shim guards): plain ``python -m`` takes the directory's package."""
    job = tmp_path / "job"
    (job / "openclaw_launch").mkdir(parents=True)
    (job / "openclaw_launch" / "__init__.py").write_text("")
    (job / "openclaw_launch" / "__main__.py").write_text("print('hijacked')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--help"], cwd=job, env=env, capture_output=True, text=True
    )
    assert "hijacked" in proc.stdout
