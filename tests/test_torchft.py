"""torchft's README line under the launcher, on CPU with gloo (issue 31): its lighthouse, then one
replica group of torchft's DDP example (tests/torchft_ddp_worker.py) launched as the README does
with torchrun, ``TORCHFT_LIGHTHOUSE=http://localhost:PORT ... --master_port P --nnodes 1
--nproc_per_node 1``. The Manager opens the agent store as a client (agents/worker_store.py); it
waited there until killed before. Skipped where torchft is not installed (scripts/setup.sh --test
installs it)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from host import free_port, listening, needs_torch

ROOT = Path(__file__).resolve().parent.parent
LIGHTHOUSE = shutil.which("torchft_lighthouse") or str(Path(sys.executable).parent / "torchft_lighthouse")
pytestmark = [
    needs_torch,
    pytest.mark.skipif(
        importlib.util.find_spec("torchft") is None or not os.access(LIGHTHOUSE, os.X_OK),
        reason="torchft is not installed (pip install torchft)",
    ),
]


def test_torchfts_readme_line_trains_one_replica_group() -> None:
    port = free_port()
    lighthouse = subprocess.Popen(
        [LIGHTHOUSE, "--min_replicas", "1", "--join_timeout_ms", "100", "--bind", f"[::]:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: listening(port) or lighthouse.poll() is not None, "the lighthouse to listen")
        assert lighthouse.poll() is None, lighthouse.communicate()[1]
        line = ["--master_port", str(free_port()), "--nnodes", "1", "--nproc_per_node", "1"]
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_launch", *line, "tests/torchft_ddp_worker.py", "--steps", "3"],
            cwd=ROOT,
            env={**os.environ, "TORCHFT_LIGHTHOUSE": f"http://localhost:{port}"},
            capture_output=True,
            text=True,
            timeout=GUARD_S,
        )
    finally:
        lighthouse.kill()
        lighthouse.communicate()
    assert proc.returncode == 0, proc.stderr[-4000:] + proc.stdout[-4000:]
    assert "[rank 0] torchft steps 3" in proc.stdout
