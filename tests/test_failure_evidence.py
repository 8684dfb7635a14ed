"""Failure classes from evidence, not words (issue 32 item 7), with real launchers and workers: the
log's earlier words never outrank the exception a rank died of or the signal that killed it, so the
Slurm requeue code (``--exit-code-classes``: 75 requeue, 70 do not) follows what happened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from guards import GUARD_S

from openclaw_launch.exit_codes import REQUEUE, SCRIPT_FAILED

# a recovered NCCL hiccup in the log, then the script's own bug
NCCL_WORDS_THEN_VALUEERROR = (
    "import sys\n"
    "print('step 40: all_reduce retried once after an NCCL error (ncclRemoteError), recovered', file=sys.stderr)\n"
    "raise ValueError('bad batch shape')\n"
)
# a recovered CUDA OOM in the log, then killed from outside (another process's SIGKILL, not the OOM killer)
OOM_WORDS_THEN_SIGKILL = (
    "import os, subprocess, sys\n"
    "print('caught: CUDA out of memory. Tried to allocate 2.00 GiB; halving the batch', file=sys.stderr, flush=True)\n"
    "subprocess.run(['kill', '-KILL', str(os.getpid())])\n"
)


def launch(tmp: Path, script: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    (tmp / "train.py").write_text(script)
    report = tmp / "run.json"
    command = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "cpu", "--nproc_per_node", "1"]
    command += ["--exit-code-classes", "--report", str(report), str(tmp / "train.py")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=GUARD_S, cwd=tmp)
    return proc, json.loads(report.read_text())["attempt_history"][0]["failure"]


def test_nccl_words_before_a_valueerror_are_no_nccl_failure(tmp_path: Path) -> None:
    proc, failure = launch(tmp_path, NCCL_WORDS_THEN_VALUEERROR)
    assert (failure["failure_class"], failure["detail"]) == ("exception", "ValueError"), proc.stderr
    assert proc.returncode == SCRIPT_FAILED  # not 75: nothing outside the script failed


def test_a_sigkill_after_a_recovered_cuda_oom_is_a_kill(tmp_path: Path) -> None:
    proc, failure = launch(tmp_path, OOM_WORDS_THEN_SIGKILL)
    assert (failure["failure_class"], failure["detail"]) == ("killed", "SIGKILL"), proc.stderr
    assert proc.returncode == REQUEUE  # not 70: the rank was killed from outside
