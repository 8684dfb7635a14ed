"""torchrun's ``LOGLEVEL`` for the launcher's own log (issue 31 item 6; job/info_log.py): at INFO
both launchers say each attempt's rendezvous result (restart count, master address and port, node
rank, local and global ranks); the default says none of it; a value that is no level is exit 2
(torchrun: a traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import invoke
from guards import GUARD_S
from host import needs_torch
from torchrun_recording import SIDES, torchrun_side

ROOT = Path(__file__).resolve().parent.parent
FIELDS = ("restart_count=0", "group_rank=0", "local_ranks=[0, 1]", "global_ranks=[0, 1]", "master_port=")


def said(module: str, level: str | None) -> list[str]:
    """Which of the rendezvous result's fields the launcher's stderr holds, with ``LOGLEVEL=level``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_") and k != "LOGLEVEL"}
    if level is not None:
        env["LOGLEVEL"] = level
    line = ["--nproc-per-node", "2", "--no-python", sys.executable, "-c", "pass"]
    done = subprocess.run(
        [sys.executable, "-m", module, *line], env=env, cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S
    )
    assert done.returncode == 0, done.stderr
    return [field for field in FIELDS if field in done.stderr]


@needs_torch
@pytest.mark.parametrize("side", SIDES)
def test_loglevel_info_says_the_rendezvous_result_as_torchrun_does(side: str) -> None:
    theirs = torchrun_side("loglevel/info", side, lambda: said("torch.distributed.run", "INFO"))
    assert said("openclaw_launch", "INFO") == theirs == list(FIELDS)


def test_without_loglevel_none_of_it() -> None:
    assert said("openclaw_launch", None) == []


def test_a_loglevel_that_is_no_level_is_refused_before_anything_starts() -> None:
    proc = invoke("--nproc-per-node", "1", "--no-python", "true", env={**os.environ, "LOGLEVEL": "verbose"})
    assert proc.returncode == 2 and "LOGLEVEL='verbose' is no log level" in proc.stderr
