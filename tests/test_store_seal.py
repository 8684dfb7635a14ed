"""Issue 32 item 9: a fixed-size job's agents' store had no authentication. With
``OPENCLAW_JOB_SECRET`` on every node, every text value the agents write is sealed (an HMAC-SHA256 of
its key and text, agents/store.py): a value a client without the secret wrote, or moved from another
key, stops the reader with one line naming the key; counters stay plain numbers. On a real TCPStore
(hosted here, and the standard-library client every other node uses), then with real launchers."""

from __future__ import annotations

from pathlib import Path

import pytest
from host import free_port, needs_torch
from test_agents_loopback import finish, start

from openclaw_launch.agents.job_secret import SECRET_ENV
from openclaw_launch.agents.store import AgentError, AgentStore

pytestmark = needs_torch


def test_values_are_sealed_and_a_stranger_forges_none(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    host = AgentStore("127.0.0.1", port, True, 10.0)
    member = AgentStore("127.0.0.1", port, False, 10.0)
    monkeypatch.setenv(SECRET_ENV, "another")
    other_job = AgentStore("127.0.0.1", port, False, 10.0)
    monkeypatch.delenv(SECRET_ENV)
    stranger = AgentStore("127.0.0.1", port, False, 10.0)

    host.set("verdict", '{"refused": []}')
    assert member.get("verdict") == '{"refused": []}' and member.get_many(["verdict"]) == ['{"refused": []}']
    assert stranger.get("verdict").startswith("sealed1:")  # readable by anyone: sealed, not secret
    for reader in (other_job, member):
        stranger.set("verdict", '{"refused": []}')  # a client without the secret overwrites it
        with pytest.raises(AgentError, match=f"holds 'verdict' without this job's seal.*{SECRET_ENV}"):
            reader.get("verdict")
    host.set("fp/0", "{}")
    stranger.set("fp/1", stranger.get("fp/0"))  # a sealed value moved to another key
    with pytest.raises(AgentError, match="'fp/1'"):
        member.get_many(["fp/0", "fp/1"])
    assert stranger.first("member/1", "forged") == "forged"  # a claim taken first
    with pytest.raises(AgentError, match="'member/1'"):
        member.first("member/1", "node1's launcher")
    assert member.first("member/2", "mine") == "mine" and host.first("member/2", "theirs") == "mine"
    member.set_counter("hb/1", 0)  # counters are numbers to the store: add works on them
    assert member.add("hb/1", 1) == 1 and host.get_counters(["hb/1"]) == ["1"]


def test_two_nodes_with_the_secret_run_and_another_secret_is_refused(tmp_path: Path) -> None:
    same = {node: {SECRET_ENV: "s3cret"} for node in ("node0", "node1")}
    results = finish(start(tmp_path, ["--exit", "0"], env=same))
    assert [code for code, _ in results.values()] == [0, 0], results
    differ = {"node0": {SECRET_ENV: "s3cret"}, "node1": {SECRET_ENV: "another"}}
    results = finish(start(tmp_path, ["--exit", "0"], ["--agent-timeout-s", "3"], env=differ))
    assert [code for code, _ in results.values()] == [2, 2], results
    assert "'fp/1' without this job's seal" in results["node0"][1], results["node0"][1]
    assert all("Traceback" not in text for _, text in results.values()), results
