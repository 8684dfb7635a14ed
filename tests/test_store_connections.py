"""Each node holds the same connections to the agents' store for the job's life (issue 29,
stats/job_live_store.py): three loopback launchers with a live line every second. At node 0's job
lines, every node's client connections to the agents' port (its helpers' sockets, by local port)
are the ones it had at the first: its agent helper's and its statistics helper's, none opened an
interval. Then the store answers nobody for a while (its process stopped, as a store stalled by its
reverse DNS lookups is): the calls wait, no node connects again, and node 0's verdict comes back on
the same connections. Counted in lines, never timed.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import IO

import psutil
import pytest
from guards import GUARD_S, wait_for
from host import free_port

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "benchmarks" / "scale_worker.py")
NODES = 3
JOB_LINE = "openclaw-launch: job stats: 3 of 3 node(s)"
OWN_LINE = "openclaw-launch: stats:"
pytestmark = pytest.mark.usefixtures("served_agent_stores")


def store_connections(launcher: int, agent_port: int) -> set[tuple[str, int]]:
    """A node's client connections to the agents' port: (the process's name, the local port)."""
    found = set()
    root = psutil.Process(launcher)
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            for c in proc.net_connections("tcp"):
                if c.raddr and c.raddr.port == agent_port and c.status == psutil.CONN_ESTABLISHED:
                    found.add((proc.name(), c.laddr.port))
    return found


def store_process(agent_port: int) -> psutil.Process:
    """The process that listens on the agents' port (the tests' store server's child for this store)."""
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == agent_port and c.status == psutil.CONN_LISTEN and c.pid:
            return psutil.Process(c.pid)
    raise AssertionError(f"nothing listens on the agents' port {agent_port}")


class Lines:
    """Node 0's output as it comes (its pipe read unbuffered), kept: counts what it has said so far."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.fd, self.text = stream.fileno(), ""

    def until(self, text: str, count: int) -> None:
        """Read until ``text`` was said ``count`` times in all."""

        def enough() -> bool:
            if self.text.count(text) < count and select.select([self.fd], [], [], 1.0)[0]:
                chunk = os.read(self.fd, 65536)
                assert chunk, f"node 0 ended before saying {text!r} {count} times: {self.text}"
                self.text += chunk.decode(errors="replace")
            return self.text.count(text) >= count

        wait_for(enough, lambda: f"node 0 said {text!r} fewer than {count} times: {self.text}", poll_s=0)


def test_every_node_keeps_its_store_connections_over_intervals_and_a_stalled_store(tmp_path: Path) -> None:
    agent_port, master_port = free_port(), free_port()
    (tmp_path / "go-0").touch()  # the workers step from the start
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(ROOT)
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"node{k}.log" for k in range(NODES)]
    files = [open(log, "w") for log in logs[1:]]  # noqa: SIM115 (closed below)
    try:
        for k in range(NODES):
            cmd = [sys.executable, "-m", "openclaw_launch", "--nnodes", str(NODES), "--node-rank", str(k)]
            cmd += ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(master_port)]
            cmd += ["--agent-port", str(agent_port), "--stats-interval-s", "1", "--keepalive-s", "60"]
            cmd += [WORKER, str(tmp_path), "--step-s", "0.02"]
            out = subprocess.PIPE if k == 0 else files[k - 1]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
        assert procs[0].stdout is not None
        node0 = Lines(procs[0].stdout)
        node0.until(JOB_LINE, 1)  # every node has written: each helper has its connection
        first = [store_connections(p.pid, agent_port) for p in procs]
        # node 0's agent store is the tests' store server's (tests/conftest.py): its statistics helper's only
        assert sorted(n for n, _ in first[0]) == ["openclaw-stats"], first
        assert all(sorted(n for n, _ in c) == ["openclaw-agent", "openclaw-stats"] for c in first[1:]), first
        node0.until(JOB_LINE, 6)
        assert [store_connections(p.pid, agent_port) for p in procs] == first
        store = store_process(agent_port)
        store.suspend()  # nobody's call is answered: node 0's own lines go on, its verdict waits
        try:
            node0.until(OWN_LINE, node0.text.count(OWN_LINE) + 4)
        finally:
            store.resume()
        node0.until(JOB_LINE, node0.text.count(JOB_LINE) + 3)
        assert [store_connections(p.pid, agent_port) for p in procs] == first
        (tmp_path / "stop").touch()
        rest, _ = procs[0].communicate(timeout=GUARD_S)
        codes = [p.wait(timeout=GUARD_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in files:
            f.close()
    said = node0.text + rest.decode(errors="replace") + "".join(log.read_text() for log in logs[1:])
    assert codes == [0] * NODES, said
    assert "job stats: lost the connection" not in said and "no verdict this interval" not in said, said
