"""torchrun's agent store (issue 31 item 1): node rank 0's launcher hosts the job's TCPStore at
MASTER_ADDR:MASTER_PORT for the job's life and the ranks are told so
(TORCHELASTIC_USE_AGENT_STORE=True), so a worker that opens it as a client before its process group
(torchft's Manager) and ``init_process_group("env://")`` find it: on one node, on two launchers on
loopback, in an elastic world, across a restart (the keys of attempt 0 are still there, as under
torchrun), with the plan showing it; a port in use is exit 2 before anything starts."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_runner import invoke
from guards import GUARD_S
from host import free_port, needs_torch
from torchrun_recording import SIDES, torchrun_side

pytestmark = needs_torch

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/agent_store_worker.py"
SAID = re.compile(r"rank (\d+) attempt (\d+) agent-store (True|False) earlier-keys (True|False)")


def launch(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def observed(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The exit code and what every rank said, sorted (the launchers prefix lines differently)."""
    out, err = proc.communicate(timeout=GUARD_S)
    said = sorted(" ".join(m.groups()) for m in SAID.finditer(out))
    return {"exit_code": proc.returncode, "said": said, "stderr": err[-3000:]}


def recorded(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """What the recording keeps of torchrun's run: its exit code and what the ranks said."""
    result = observed(proc)
    assert result["exit_code"] == 0, result["stderr"]
    return {"exit_code": result["exit_code"], "said": result["said"]}


def same(theirs: dict[str, Any], ours: dict[str, Any]) -> None:
    assert {k: theirs[k] for k in ("exit_code", "said")} == {k: ours[k] for k in ("exit_code", "said")}, ours["stderr"]


@pytest.mark.parametrize("side", SIDES)
def test_a_client_of_the_agent_store_before_init_process_group(side: str) -> None:
    """The six-line client-store script: rc 0 under torchrun, and now under openclaw (it waited
    for the store until killed)."""
    line = ["--nproc-per-node", "2", WORKER]
    ours = launch("openclaw_launch", *line)
    theirs = torchrun_side(
        "agent_store/client_before_group", side, lambda: recorded(launch("torch.distributed.run", *line))
    )
    mine = observed(ours)
    same(theirs, mine)
    assert mine["said"] == ["0 0 True False", "1 0 True False"]


def test_a_fresh_store_for_each_attempt() -> None:
    """Attempt 1's ranks find a new, empty store at the same address, and their group forms again.
    torchrun 2.13 keeps one store for the job: its attempt 1 reads attempt 0's gloo addresses and
    fails in most restarts of this worker (docs/torchrun-compat.md: measured 4 of 6)."""
    result = observed(launch("openclaw_launch", "--nproc-per-node", "2", "--max-restarts", "1", WORKER, "--fail-first"))
    assert result["exit_code"] == 0, result["stderr"]
    assert result["said"] == ["0 0 True False", "0 1 True False", "1 0 True False", "1 1 True False"], result


def test_two_launchers_on_loopback_share_node_0s_store(served_agent_stores: None) -> None:
    """Node 1's rank opens node 0's launcher's store (node 0's own rank is no host either)."""
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    nodes = [launch("openclaw_launch", *common, "--node-rank", str(k), WORKER) for k in (0, 1)]
    results = [observed(p) for p in nodes]
    assert [r["exit_code"] for r in results] == [0, 0], [r["stderr"] for r in results]
    assert [r["said"] for r in results] == [["0 0 True False"], ["1 0 True False"]]


def test_an_elastic_world_has_the_store_of_its_node_rank_0(served_agent_stores: None) -> None:
    line = ["--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-id", "store"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-conf", "last_call_timeout=0"]
    result = observed(launch("openclaw_launch", *line, "--max-restarts", "1", WORKER, "--fail-first"))
    assert result["exit_code"] == 0, result["stderr"]
    assert "0 1 True False" in result["said"] and "1 1 True False" in result["said"], result


def test_the_plan_shows_the_agent_store_and_torchruns_opt_out() -> None:
    def store_env(extra: dict[str, str]) -> set[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")} | extra
        shown = invoke("plan", "--json", "--nproc-per-node", "2", "train.py", env=env)
        assert shown.returncode == 0, shown.stderr
        return {r["env"]["TORCHELASTIC_USE_AGENT_STORE"] for r in json.loads(shown.stdout)["ranks"]}

    assert store_env({}) == {"True"}
    assert store_env({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}) == {"False"}  # rank 0 hosts it, as before


def test_a_master_port_in_use_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        marker = tmp_path / "ran"
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "1", "--master-port", str(port)]
            + ["--no-python", "touch", str(marker)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=GUARD_S,
        )
    assert proc.returncode == 2, proc.stderr
    assert f"MASTER_PORT {port} (in use" in proc.stderr and "--master-port" in proc.stderr
    assert "Traceback" not in proc.stderr and not marker.exists()
