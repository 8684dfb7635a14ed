"""One voice for the restart decision (run/failure_policy.py, issue 33; issue 31 item 4): the failure
class's words and what the launcher does agree, with real launchers and real workers on CPU.

- ``--max-restarts N`` makes every attempt torchrun makes: a start-up failure that clears on the
  third try is retried (torchrun, where installed, is run on the same script as the reference);
- the exit summary of a job that a restart fixed never says "a restart cannot help";
- a class where a restart cannot help (CUDA out of memory) is not restarted, and the line says so
  and how to override it; with ``--restart-any-class`` it is, and the line says that too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from guards import GUARD_S
from host import free_port

# fails on attempts 0 and 1 before anything else (as a start-up failure: a mount not there yet), then works
FLAKY_START = (
    "import os, sys\n"
    "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
    "if attempt < 2:\n"
    "    sys.exit(f'dataset not mounted yet (attempt {attempt})')\n"
    "print('trained', flush=True)\n"
)
# dies of CUDA's out-of-memory error as torch's C++ raises it (no torch needed: the traceback is the evidence)
CUDA_OOM = (
    "import os\n"
    "print('attempt', os.environ['TORCHELASTIC_RESTART_COUNT'], flush=True)\n"
    "raise RuntimeError('CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)')\n"
)


def launch(tmp: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    path = tmp / "train.py"
    path.write_text(script)
    report = tmp / "run.json"
    command = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "cpu", "--nproc_per_node", "1"]
    command += ["--restart-backoff-s", "0.05", "--report", str(report), *args, str(path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=GUARD_S, cwd=tmp)
    return proc, json.loads(report.read_text())


def test_max_restarts_2_makes_every_attempt_a_start_up_failure_needs(tmp_path: Path) -> None:
    proc, report = launch(tmp_path, FLAKY_START, "--max-restarts", "2")
    assert proc.returncode == 0, proc.stderr
    assert report["attempts"] == 3 and "trained" in proc.stdout
    assert [a["failure"]["failure_class"] for a in report["attempt_history"][:2]] == ["exit", "exit"]
    assert "restart storm" not in proc.stderr and "cannot help" not in proc.stderr + proc.stdout
    # the summary of the two failed attempts says what a restart can do and what was done
    assert "attempt 1: failure class exit (exit code 1), rank 0 on node" in proc.stderr
    assert "a restart may help; restarted" in proc.stderr


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is the reference where installed")
def test_torchrun_makes_the_same_three_attempts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(FLAKY_START)
    command = ["torchrun", "--standalone", "--nproc-per-node", "1", "--max-restarts", "2", "train.py"]
    env = {**os.environ, "MASTER_PORT": str(free_port())}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=GUARD_S, cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "trained" in proc.stdout, proc.stderr
    ours, _ = launch(tmp_path, FLAKY_START, "--max-restarts", "2")
    assert ours.returncode == proc.returncode and ours.stdout.count("trained") == proc.stdout.count("trained")


def test_the_storm_guard_is_asked_for(tmp_path: Path) -> None:
    """The same start-up failure twice in a row stops the job only with --storm-guard."""
    proc, report = launch(tmp_path, FLAKY_START, "--max-restarts", "2", "--storm-guard")
    assert proc.returncode == 1 and report["attempts"] == 2, proc.stderr
    assert "restart storm: rank 0" in proc.stderr and "as --storm-guard asks" in proc.stderr


def test_a_class_a_restart_cannot_help_is_not_restarted_and_the_line_says_so(tmp_path: Path) -> None:
    proc, report = launch(tmp_path, CUDA_OOM, "--max-restarts", "2", "--exit-code-classes")
    assert proc.returncode == 70 and report["attempts"] == 1, proc.stderr
    assert [a["failure"]["failure_class"] for a in report["attempt_history"]] == ["cuda-oom"]
    line = next(line for line in proc.stderr.splitlines() if "not restarting" in line)
    assert "failure class cuda-oom" in line and "a restart cannot help" in line
    assert "2 of --max-restarts 2 unused" in line and "--restart-any-class restarts it anyway" in line
    assert "attempt 2/" not in proc.stderr


def test_restart_any_class_overrides_it_and_the_line_says_which(tmp_path: Path) -> None:
    proc, report = launch(tmp_path, CUDA_OOM, "--max-restarts", "2", "--restart-any-class")
    assert proc.returncode == 1 and report["attempts"] == 3, proc.stderr
    assert proc.stdout.count("attempt") == 3
    anyway = [line for line in proc.stderr.splitlines() if "restarting it anyway" in line]
    assert len(anyway) == 2 and all("cuda-oom" in line and "--restart-any-class" in line for line in anyway)
    assert "not restarting" not in proc.stderr
    assert "a restart cannot help; restarted, as --restart-any-class asks" in proc.stderr  # the exit summary
