"""The agents' store held by the session's store server (openclaw_launch/agents/served_store.py,
tests/conftest.py's ``served_agent_stores``): it answers every call as torch's TCPStore in the
helper does, a host's store ends with its helper even inside a call, and a two-node job on it never
imports torch in a launcher or its helpers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from guards import GUARD_S, wait_for
from host import free_port, needs_torch

from openclaw_launch.agents.served_store import SERVER_ENV
from openclaw_launch.agents.store import AgentError, AgentStore

if TYPE_CHECKING:
    from conftest import AgentStoreServer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = needs_torch  # the server's stores are torch's TCPStore


def _every_call(port: int) -> list[object]:
    """What the agents' calls answer on a host and a client of a store at ``port``, and the errors
    of a second host there, of a wait that times out and of a client with no host to reach."""
    host = AgentStore("127.0.0.1", port, True, 5)
    client = AgentStore("127.0.0.1", port, False, 5)
    host.within("w/").set("a", "é\n{}")  # not ASCII, a newline and JSON's own characters
    seen: list[object] = [client.within("w/").get("a"), client.has(["w/a"]), client.has(["w/a", "b"])]
    seen += [client.first("f", "one"), host.first("f", "two"), client.add("n", 2), host.add("n", 3)]
    seen.append(client.get_many(["w/a", "f", "n"]))
    with pytest.raises(AgentError) as second_host:
        AgentStore("127.0.0.1", port, True, 5)
    client.set_timeout(0.5)
    with pytest.raises(RuntimeError) as waited:  # TCPStore's DistStoreError, a RuntimeError
        client.get("missing")
    nobody = free_port()
    with pytest.raises(AgentError) as unreachable:
        AgentStore("127.0.0.1", nobody, False, 0.5)
    texts = [str(e.value).splitlines()[0] for e in (second_host, waited, unreachable)]
    return [*seen, *(text.replace(str(port), "PORT").replace(str(nobody), "NOBODY") for text in texts)]


def test_a_served_store_answers_every_call_as_torchs_tcpstore(
    agent_store_server: AgentStoreServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_helper = _every_call(free_port())  # torch imported here, as in a helper
    monkeypatch.setenv(SERVER_ENV, agent_store_server.running())
    assert _every_call(free_port()) == in_helper


HOST = """
import sys
from openclaw_launch.agents.store import AgentStore
host = AgentStore("127.0.0.1", int(sys.argv[1]), True, 60)
host.set("a", "here")
print("ready", flush=True)
host.get("never set")  # waiting inside a call when it is killed
"""


def _gone(client: AgentStore, key: str) -> bool:
    """The key is there as long as the host's store is; the server drops the store once it sees
    the helper's connection close, which may come after the helper's exit status."""
    try:
        client.get(key)
    except RuntimeError:
        return True
    return False


@pytest.mark.usefixtures("served_agent_stores")
def test_a_served_hosts_store_ends_with_its_helper_even_inside_a_call() -> None:
    port = free_port()
    helper = subprocess.Popen([sys.executable, "-c", HOST, str(port)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert helper.stdout is not None and helper.stdout.readline() == "ready\n"
        client = AgentStore("127.0.0.1", port, False, GUARD_S)
        assert client.get("a") == "here"
        helper.send_signal(signal.SIGKILL)
        helper.wait(GUARD_S)
        wait_for(lambda: _gone(client, "a"), "the killed helper's store still answers")
    finally:
        helper.kill()
        helper.wait(GUARD_S)


@pytest.mark.usefixtures("served_agent_stores")
def test_a_two_node_job_on_served_stores_never_imports_torch(tmp_path: Path) -> None:
    """The saving the suite counts on: no launcher of a job on served stores, nor its helpers (forked
    from it, so they inherit ``-X importtime``), imports torch: the host's store is served, the
    other node's agent is the standard-library client."""
    master, agent = str(free_port()), str(free_port())
    launchers = []
    for node in ("node0", "node1"):
        command = [sys.executable, "-X", "importtime", "-m", "openclaw_launch", "--config"]
        command += [str(ROOT / "configs" / "two-nodes-loopback.yaml"), "--node", node, "--master-port", master]
        command += ["--agent-port", agent, "--telemetry", "off", "--no-python", "--", "true"]
        launchers.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    store_modules = ("openclaw_launch.agents.served_store", "openclaw_launch.agents.tcpstore_client")
    for launcher, store_module in zip(launchers, store_modules, strict=True):
        _, err = launcher.communicate(timeout=GUARD_S)
        assert launcher.returncode == 0, err[-3000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")}
        assert store_module in imported
        assert not {m for m in imported if m.split(".")[0] == "torch"}
