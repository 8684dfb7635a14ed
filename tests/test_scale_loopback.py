"""Sixteen launchers on loopback as one elastic job of 16 nodes (issue 29): a node lost re-forms the
world of the other 15, and one rank's failure there ends every launcher with one fate. The workers
are benchmarks/scale_worker.py (standard library only), the agents' stores served by the session's
store server, so the cost is the launchers' own. benchmarks/scale.py measures the same at up to 128.

Serial: sixteen launchers, their helpers and workers are the whole of a 2-core machine for a while.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from guards import GUARD_S, wait_for
from host import free_port, needs_torch

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "benchmarks" / "scale_worker.py")
NODES = 16
pytestmark = [needs_torch, pytest.mark.serial, pytest.mark.usefixtures("served_agent_stores")]


def ready(directory: Path, attempt: int) -> set[int]:
    """The ranks whose worker of ``attempt`` runs."""
    return {int(p.name.split("-")[1]) for p in directory.glob(f"ready-*-{attempt}")}


def node_rank(log: Path) -> int | None:
    found = re.search(r"node rank (\d+) of", log.read_text(errors="replace"))
    return int(found.group(1)) if found else None


def kill_tree(pid: int) -> None:
    """A node that dies takes its workers with it: the launcher and everything under it at once."""
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)


def test_sixteen_nodes_reform_without_a_lost_one_then_end_with_one_fate(tmp_path: Path) -> None:
    port = free_port()
    line = [sys.executable, "-m", "openclaw_launch", "--nnodes", f"1:{NODES}", "--nproc-per-node", "1"]
    line += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--max-restarts", "1"]
    line += ["--keepalive-s", "2", "--telemetry", "off"]
    line += [WORKER, str(tmp_path), "--fail-rank", "3", "--fail-attempt", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(ROOT)
    logs = [tmp_path / f"launcher-{i}.log" for i in range(NODES)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for log in logs:
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(line, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT))
        wait_for(lambda: len(ready(tmp_path, 0)) == NODES, lambda: f"attempt 0 ran {sorted(ready(tmp_path, 0))}")
        ranks = {node_rank(log): i for i, log in enumerate(logs)}
        lost = ranks[NODES // 2]  # not node rank 0, which hosts the rendezvous
        kill_tree(procs[lost].pid)
        wait_for(
            lambda: len(ready(tmp_path, 1)) == NODES - 1,
            lambda: f"attempt 1 ran {sorted(ready(tmp_path, 1))}; the first node said:\n{logs[ranks[0]].read_text()}",
        )
        (tmp_path / "go-1").touch()  # rank 3 of the new world exits 3: no restart is left
        survivors = [p for i, p in enumerate(procs) if i != lost]
        codes = [p.wait(timeout=GUARD_S) for p in survivors]
    finally:
        (tmp_path / "stop").touch()
        for p in procs:
            kill_tree(p.pid)
            p.wait()
    texts = {i: log.read_text(errors="replace") for i, log in enumerate(logs)}
    assert codes == [3] * (NODES - 1), {i: t[-600:] for i, t in texts.items() if i != lost}
    host = texts[ranks[0]]
    assert f"run none on {NODES - 1} nodes" in host, host[-2000:]
    assert all("rank 3" in t and "exited with code 3" in t for i, t in texts.items() if i != lost)
