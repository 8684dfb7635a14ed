"""Several launchers, one job: the two-node config on loopback, one gloo world of 3 ranks (2 + 1)
started by two `openclaw-launch --node ...` processes, as two hosts would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from guards import GUARD_S
from host import free_port, needs_torch

ROOT = Path(__file__).resolve().parent.parent
pytestmark = needs_torch  # gloo ranks, and the agents meet through torch's TCPStore


def test_two_launchers_make_one_world() -> None:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "openclaw_launch",
                "--config",
                "configs/two-nodes-loopback.yaml",
                "--node",
                node,
                "--master-port",
                port,
                "--run-id",
                "loop",
                "tests/allreduce_worker.py",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in ("node0", "node1")
    ]
    outs = [p.communicate(timeout=GUARD_S) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err
    node0, node1 = outs[0][0], outs[1][0]
    assert "[rank 0] rank 0/3 local 0 sum 3" in node0 and "[rank 1] rank 1/3 local 1 sum 3" in node0
    assert "[rank 2] rank 2/3 local 0 sum 3" in node1  # node1 holds the last global rank
