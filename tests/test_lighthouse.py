"""openclaw's lighthouse (``--lighthouse openclaw``, run/lighthouse_server.py), driven by torchft's own
client (``torchft._torchft.LighthouseClient``, the Rust client its Managers use): torchft's quorum
rule over its gRPC protocol, and what torchft's lighthouse cannot do: a "group gone" notice forms the
waiting survivor's quorum at once. The end-to-end kill under the launcher is
tests/test_replica_groups.py's; the quorum rule's timeouts are checked on the pure state here (no
clock in a real process is asserted on). Skipped where torchft or grpcio is not installed.

The client holds the GIL while it waits, so each replica that waits for a quorum is a process of
its own (as a Manager is), and it loads torchft's extension module alone (``_CLIENT``): torchft's
package imports torch (1 s), the extension 0.07 s."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for

from openclaw_launch.plan.replica_groups import LIGHTHOUSE_NOTICES_ENV, OPENCLAW_LIGHTHOUSE_MODULE
from openclaw_launch.run.lighthouse_quorum import QuorumSettings, QuorumState

needs = pytest.mark.skipif(
    importlib.util.find_spec("torchft") is None or importlib.util.find_spec("grpc") is None,
    reason="torchft or grpcio is not installed (pip install 'openclaw-launch[torchft]')",
)

_NEVER_MS = str(int(GUARD_S * 1000 * 10))  # heartbeats and joins that never expire within a test
_PORTS = {"r0": 1001, "r1": 1002, "r1b": 1002}  # each replica's group's store port (group 1 restarted: r1b)
_CLIENT = """import importlib.machinery, importlib.util, json, os, sys
from datetime import timedelta
where = importlib.util.find_spec("torchft").submodule_search_locations[0]
path = os.path.join(where, "_torchft" + importlib.machinery.EXTENSION_SUFFIXES[0])
spec = importlib.util.spec_from_file_location("torchft._torchft", path)
torchft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torchft)
address, what, replica, port = sys.argv[1:]
client = torchft.LighthouseClient(address, timedelta(seconds=float(os.environ["GUARD_S"])))
if what == "heartbeat":
    client.heartbeat(replica)
    sys.exit(0)
q = client.quorum(replica_id=replica, timeout=timedelta(seconds=float(os.environ["GUARD_S"])),
    address="http://127.0.0.1:1" + port, store_address="127.0.0.1:" + port, step=7, world_size=1)
members = [[p.replica_id, p.store_address, p.step, p.world_size] for p in q.participants]
print(json.dumps([q.quorum_id, members]))
"""


@dataclass
class _Lighthouse:
    address: str
    log: Path
    notices: int

    def ask(self, what: str, replica_id: str) -> subprocess.Popen[str]:
        """A replica's heartbeat or quorum request, in a process of its own (the module's docstring)."""
        argv = [sys.executable, "-c", _CLIENT, self.address, what, replica_id, str(_PORTS[replica_id])]
        env = {**os.environ, "GUARD_S": str(GUARD_S)}
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def heartbeat(self, *replica_ids: str) -> None:
        for asked in [self.ask("heartbeat", r) for r in replica_ids]:
            assert asked.wait(timeout=GUARD_S) == 0, asked.communicate()[1]

    def requests(self, replica_id: str) -> int:
        """How many quorum requests of ``replica_id`` the lighthouse has received."""
        return self.log.read_text().count(f"Received quorum request for replica {replica_id}\n")

    def quorums(self, *asked: subprocess.Popen[str]) -> list[tuple[int, list[str]]]:
        """Each request's quorum: its id and members' ids (their other fields checked as sent)."""
        out = []
        for a in asked:
            stdout, stderr = a.communicate(timeout=GUARD_S)
            assert a.returncode == 0, stderr
            quorum_id, members = json.loads(stdout)
            assert all(m[1:] == [f"127.0.0.1:{_PORTS[m[0]]}", 7, 1] for m in members), members
            out.append((quorum_id, [m[0] for m in members]))
        return out


@contextlib.contextmanager
def _started(tmp_path: Path, *more: str) -> Iterator[_Lighthouse]:
    """The server as the launcher spawns it (torchft_lighthouse's options, a free port, the notices'
    FIFO held open for writing as job/replica_groups.py holds it), with timeouts no test outlives."""
    fifo, log = tmp_path / "notices", tmp_path / "lighthouse.log"
    os.mkfifo(fifo)
    notices = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    argv = [sys.executable, "-m", OPENCLAW_LIGHTHOUSE_MODULE, "--min_replicas", "1", "--quorum_tick_ms", "20"]
    argv += ["--join_timeout_ms", _NEVER_MS, "--heartbeat_timeout_ms", _NEVER_MS, "--bind", "127.0.0.1:0", *more]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env={**os.environ, LIGHTHOUSE_NOTICES_ENV: str(fifo)}, stderr=out)
    try:
        said = wait_for(lambda: re.search(r"listening on: .* \(port (\d+)\)", log.read_text()), "it to listen")
        yield _Lighthouse(f"http://127.0.0.1:{said.group(1)}", log, notices)
    finally:
        proc.kill()
        proc.wait()
        os.close(notices)


@pytest.fixture
def lighthouse(tmp_path: Path) -> Iterator[_Lighthouse]:
    with _started(tmp_path) as started:
        yield started


@needs
def test_torchfts_client_gets_torchfts_quorums_and_a_gone_group_frees_the_survivor(lighthouse: _Lighthouse) -> None:
    """Two replicas (groups at store ports 1001, 1002) form quorum 1, sorted by replica id, their
    fields back as sent; the same members again keep id 1. Then r0 asks alone: with r1 still
    heartbeating (for good, here) torchft's split-brain rule holds it, until the launcher's notice
    that r1's group (port 1002) is gone forms quorum 2 of r0 at once. r1 is refused from then on;
    the group's restarted replica (a new id, same port) asks first (had r0 asked first, r0's fast
    quorum would leave it for r0's next step) and joins quorum 3 with r0."""
    for _ in range(2):  # the second time the same members: no quorum change
        lighthouse.heartbeat("r1", "r0")
        asked = lighthouse.ask("quorum", "r1"), lighthouse.ask("quorum", "r0")
        assert lighthouse.quorums(*asked) == [(1, ["r0", "r1"])] * 2

    alone = lighthouse.ask("quorum", "r0")
    wait_for(lambda: lighthouse.requests("r0") == 3, "r0's third request to arrive")
    assert alone.poll() is None
    os.write(lighthouse.notices, b"gone 1002\n")
    assert lighthouse.quorums(alone) == [(2, ["r0"])]

    refused = lighthouse.ask("quorum", "r1")
    assert refused.wait(timeout=GUARD_S) != 0 and "its group is gone" in refused.communicate()[1]
    lighthouse.heartbeat("r1b")
    joining = lighthouse.ask("quorum", "r1b")  # held by the split-brain rule until r0 asks again
    wait_for(lambda: lighthouse.requests("r1b") == 1, "r1b's request to arrive")
    assert lighthouse.quorums(joining, lighthouse.ask("quorum", "r0")) == [(3, ["r0", "r1b"])] * 2


@needs
def test_the_first_quorum_waits_for_the_expected_groups(tmp_path: Path) -> None:
    """With ``--expected_replicas 2`` (the launcher's K) r0, alone and the only replica seen, is no
    quorum (torchft's rule would form one at once): it waits until r1 asks, then both get quorum 1."""
    with _started(tmp_path, "--expected_replicas", "2") as lighthouse:
        first = lighthouse.ask("quorum", "r0")
        wait_for(lambda: "waiting for 1 of 2 replica groups" in lighthouse.log.read_text(), "r0 to wait for r1")
        assert first.poll() is None
        assert lighthouse.quorums(first, lighthouse.ask("quorum", "r1")) == [(1, ["r0", "r1"])] * 2


@dataclass
class _Member:
    replica_id: str
    store_address: str = "h:1"
    shrink_only: bool = False
    commit_failures: int = 0


def test_the_rule_waits_for_stragglers_until_the_join_timeout_and_forgets_old_heartbeats() -> None:
    """torchft's ``quorum_compute`` on a given clock: a heartbeating replica that has not asked is
    waited for until the join timeout after the first participant joined; a replica whose heartbeat
    is older than the heartbeat timeout counts for nothing; commit failures bump the quorum id."""
    state = QuorumState(QuorumSettings(min_replicas=1, join_timeout_s=1.0, heartbeat_timeout_s=5.0))
    for replica in ("a", "b", "c"):
        state.heartbeat(replica, 0.0)
    state.join(_Member("a"), 0.0)
    state.join(_Member("b"), 0.1)
    assert state.tick(0.5)[0] is None  # c heartbeats: waited for
    formed, reason = state.tick(1.0)
    assert formed is not None and [m.replica_id for m in formed.members] == ["a", "b"], reason
    state.join(_Member("a"), 6.0)  # b's and c's heartbeats are 6 s old: a alone is all there is
    formed, _ = state.tick(6.0)
    assert formed is not None and (formed.quorum_id, [m.replica_id for m in formed.members]) == (2, ["a"])
    state.join(_Member("a", commit_failures=1), 6.5)
    formed, _ = state.tick(6.5)  # a fast quorum, same members, but a commit failure
    assert formed is not None and formed.quorum_id == 3


def test_the_first_quorum_waits_for_every_group_not_gone_until_the_start_timeout() -> None:
    """openclaw's start rule on a given clock: with 3 expected groups the first quorum waits for all 3
    (long past the join timeout) and forms at 3; a group said gone before it asked (even before any
    replica of it was seen) is not waited for; past the start timeout torchft's rule forms it without
    the late group; after the first quorum a missing group is torchft's straggler again."""
    settings = QuorumSettings(1, join_timeout_s=0.3, heartbeat_timeout_s=100.0, expected_replicas=3, start_timeout_s=30)

    def started(*replicas: str) -> QuorumState:
        state = QuorumState(settings)
        for at, replica in enumerate(replicas):
            state.join(_Member(replica, f"h:{100 + at}"), 0.0)
        return state

    state = started("a", "b")
    formed, reason = state.tick(10.0)
    assert formed is None and "waiting for 1 of 3" in reason, reason
    state.join(_Member("c", "h:102"), 10.0)
    formed, reason = state.tick(10.0)
    assert formed is not None and [m.replica_id for m in formed.members] == ["a", "b", "c"], reason

    state = started("a", "b")
    assert state.group_gone("102") == []  # group 2 died before its Manager asked
    formed, reason = state.tick(0.0)
    assert formed is not None and [m.replica_id for m in formed.members] == ["a", "b"], reason
    state.join(_Member("c2", "h:102"), 1.0)  # its restarted replica: torchft's rule (a fast quorum without it)
    state.join(_Member("a", "h:100"), 1.0)
    state.join(_Member("b", "h:101"), 1.0)
    formed, _ = state.tick(1.0)
    assert formed is not None and formed.quorum_id == 2

    state = started("a", "b")
    assert state.tick(29.9)[0] is None
    formed, reason = state.tick(30.0)  # the start timeout: torchft's rule, c never seen
    assert formed is not None and [m.replica_id for m in formed.members] == ["a", "b"], reason
    state.join(_Member("a", "h:100"), 31.0)
    state.join(_Member("b", "h:101"), 31.0)
    assert state.tick(31.0)[0] is not None  # after the first quorum: no wait for c

    torchfts = QuorumState(QuorumSettings(1, join_timeout_s=0.3, heartbeat_timeout_s=100.0))
    torchfts.join(_Member("a", "h:100"), 0.0)
    assert torchfts.tick(0.0)[0] is not None  # expected_replicas 0: torchft's rule from the start
