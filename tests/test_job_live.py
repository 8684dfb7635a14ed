"""The job's live verdict across nodes (issue 27 item 8): three loopback launchers of one gloo job, the
straggler on the middle node. Node 0's console names it by node and rank while the job runs, which
no node's own live line can (each judges only its own rank). Plus the pure parts: the key's value
round trip and the merged judgement."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from guards import GUARD_S, read_until, wait_for
from host import free_port, needs_torch

from openclaw_launch.agents.tcpstore_client import TCPStoreClient
from openclaw_launch.stats.collect import PhaseSummary, RankSummary
from openclaw_launch.stats.job_live import (
    LIVE_WINDOWS,
    JobLiveTarget,
    decode_node,
    encode_node,
    encode_ranks,
    judge,
    node_key,
)
from openclaw_launch.stats.job_live_store import StoreClient
from openclaw_launch.stats.job_live_thread import CATCH_UP_READS, STALE_READS, Interval, JobLive
from openclaw_launch.stats.judged import Judged


def job_live_target_connect(host: str, port: int, timeout_s: float) -> TCPStoreClient:
    return TCPStoreClient(host, port, timedelta(seconds=timeout_s))


ROOT = Path(__file__).resolve().parent.parent
NANOGPT = str(ROOT / "tests" / "telemetry_workers" / "nanogpt_loop.py")
NODES = ("node0", "node1", "node2")
INTERVAL_S = 1  # the lines are counted, not timed: a loaded box only makes them judge later
STRAGGLER_METRIC = r'openclaw_job_straggler_excess_ratio\{node="node1",phase="input",rank="1"'

CONFIG = """\
cluster:
  nodes:
    - {name: node0, ip: 127.0.0.1, cpu_workers: 1}
    - {name: node1, ip: 127.0.0.1, cpu_workers: 1}
    - {name: node2, ip: 127.0.0.1, cpu_workers: 1}
runtime:
  binding: none
  master_addr: 127.0.0.1
"""


def _summary(rank: int, own_s: float, windows: int = 30) -> RankSummary:
    """A rank whose own time per step is ``own_s`` (the rest of a 40 ms step waits in ``sync``)."""
    step_s = 0.04
    phases = {
        "forward": PhaseSummary(own_s, own_s, own_s, own_s / step_s),
        "sync": PhaseSummary(step_s - own_s, 0, 0, 0),
    }
    rows = tuple(
        (k, {"@step": step_s, "@own": own_s + 1e-4 * (k % 3), "forward": own_s, "sync": step_s - own_s})
        for k in range(windows)
    )
    return RankSummary(
        rank, 200, 150, step_s, step_s, step_s, step_s, step_s, phases, ("sync",), None, None, "optimizer", 0, rows
    )


def test_a_node_interval_round_trips_with_its_last_windows_only() -> None:
    ranks = encode_ranks([_summary(3, 0.01, windows=100)])
    node = decode_node(encode_node("node1", 1, 7, ranks))
    assert node is not None and (node.node, node.node_rank, node.seq) == ("node1", 1, 7)
    [r] = node.ranks
    assert r.rank == 3 and len(r.windows) == LIVE_WINDOWS and r.windows[-1][0] == 99
    assert decode_node(b"{not json") is None


def test_the_merged_ranks_name_the_other_nodes_straggler_by_node_and_rank() -> None:
    nodes = [
        decode_node(encode_node(name, k, 1, encode_ranks([_summary(k, 0.03 if k == 1 else 0.01)])))
        for k, name in enumerate(NODES)
    ]
    judged = judge([n for n in nodes if n is not None], 3, [], 5.0)
    assert "3 of 3 node(s), 3 rank(s)" in judged.text and "straggler: node node1 rank 1" in judged.text, judged.text
    alone = judge([n for n in nodes[:1] if n is not None], 3, [1, 2], 5.0)
    assert "1 of 3 node(s)" in alone.text and "silent: node rank(s) 1, 2" in alone.text and not alone.found


def test_the_line_judges_every_rank_of_many_nodes() -> None:
    """100 ranks on 10 nodes, every one judged (the verdict sorts each window once: stats/median.py),
    the straggler named by node and rank."""
    nodes = [
        decode_node(
            encode_node(
                f"n{k}",
                k,
                1,
                encode_ranks([_summary(r, 0.03 if r == 77 else 0.01) for r in range(10 * k, 10 * k + 10)]),
            )
        )
        for k in range(10)
    ]
    judged = judge([n for n in nodes if n is not None], 10, [], 5.0)
    assert "100 rank(s), step p50" in judged.text and "judged on" not in judged.text, judged.text
    assert "straggler: node n7 rank 77" in judged.text, judged.text


@needs_torch
@pytest.mark.usefixtures("served_agent_stores")
def test_node0_names_the_middle_nodes_straggler_live_within_two_intervals(tmp_path: Path) -> None:
    config = tmp_path / "three-nodes.yaml"
    config.write_text(CONFIG)
    master, agent = str(free_port()), str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs, logs = {}, {}
    for node in NODES:
        cmd = [sys.executable, "-m", "openclaw_launch", "--config", str(config), "--node", node]
        cmd += ["--master-port", master, "--agent-port", agent, "--run-id", "joblive", "--console-ranks", "none"]
        cmd += ["--metrics-port", "0"] if node == "node0" else []  # node 0 serves the job's numbers
        cmd += ["--job-report", str(tmp_path / "job.json")] if node == "node0" else []
        cmd += ["--stats-interval-s", str(INTERVAL_S), NANOGPT, "--steps", "5000"]
        cmd += ["--slow-rank", "1", "--slow-ms", "50"]  # rank 1: node1's one rank, the middle node
        out = None if node == "node0" else logs.setdefault(node, open(tmp_path / f"{node}.log", "w"))  # noqa: SIM115
        procs[node] = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE if out is None else out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        seen = read_until(procs["node0"], "straggler: node node1 rank 1", procs["node0"].stdout)
        port = re.search(r"metrics on http://[^:]+:(\d+)/", seen)
        assert port is not None, seen

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=GUARD_S) as answer:
                return str(answer.read().decode())

        # the endpoint refreshes on its own tick, not with the line: wait for the named straggler there
        metrics = wait_for(
            lambda: m if re.search(STRAGGLER_METRIC, m := scrape()) else "",
            "node 0's endpoint never named the job's straggler",
            poll_s=0.2,
        )
        for p in procs.values():  # named: the job need not run its 5000 steps (a stop is every node's fate)
            p.send_signal(signal.SIGTERM)
        rest, _ = procs["node0"].communicate(timeout=GUARD_S)
        for p in procs.values():
            p.wait(timeout=GUARD_S)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for f in logs.values():
            f.close()
    job_lines = [line for line in seen.splitlines() if "openclaw-launch: job stats:" in line]
    print("\n".join(job_lines))  # shown with -s: the lines up to the one that named it
    # counted from node 0's first line that judged every node's ranks: named at the first or the second
    judging = [i for i, line in enumerate(job_lines) if "3 of 3 node(s)" in line and re.search(r"straggler", line)]
    assert judging and len(job_lines) - 1 - judging[0] <= 1, "\n".join(job_lines)
    assert "(input, input) +" in job_lines[-1] or "(input, host) +" in job_lines[-1], job_lines[-1]
    # node 0 serves the job's numbers: every node's ranks, and the straggler it named by node and rank
    assert 'openclaw_job_nodes_reporting{run_id="joblive"} 3.0' in metrics, metrics
    assert all(f'openclaw_job_steps{{node="{n}",rank="{k}",run_id="joblive"}}' in metrics for k, n in enumerate(NODES))
    assert re.search(STRAGGLER_METRIC, metrics), metrics
    own = [line for line in (seen + rest).splitlines() if "openclaw-launch: stats:" in line]
    assert own and not any("straggler: rank" in line for line in own)  # node 0's own line: one rank, nothing to name
    # the job report aligns every node's steps (one rank a node: no node can by itself): rank 1 the slowest
    imbalance = json.loads((tmp_path / "job.json").read_text())["step_imbalance"]
    assert imbalance is not None and not imbalance["variance"] and imbalance["slowest_share"]["1"] > 0.9, imbalance


@needs_torch
def test_an_attempt_judges_only_its_own_keys_and_a_node_that_stops_writing_is_silent() -> None:
    """Two nodes' helpers' threads (JobLive) on a real TCPStore: node 0's line names node 1's rank;
    node 1 stops writing: after 3 of node 0's reads it is left out, named silent; the next attempt
    starts from nothing (node 1 has not written in it yet)."""
    from torch.distributed import TCPStore

    port = free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    target = JobLiveTarget("127.0.0.1", port, "attempts", 5.0, job_live_target_connect)
    lines: list[str] = []
    node0, node1 = JobLive(target, lines.append, None), JobLive(target, lines.append, None)
    slow, fast = encode_ranks([_summary(1, 0.03)]), encode_ranks([_summary(0, 0.01)])
    try:
        node1.submit(Interval(0, "node1", 1, 2, slow))
        wait_for(lambda: server.check([node_key("attempts", 0, 1)]), "node 1 never wrote its key")

        def line(attempt: int) -> str:
            count = len(lines)
            node0.submit(Interval(attempt, "node0", 0, 2, fast))
            wait_for(lambda: len(lines) > count, "node 0 judged nothing")
            return lines[-1]

        first = line(0)
        assert "2 of 2 node(s)" in first and "straggler: node node1 rank 1" in first, first
        later = [line(0) for _ in range(STALE_READS)]
        assert "silent" not in later[-2] and "1 of 2 node(s)" in later[-1] and "silent: node rank(s) 1" in later[-1]
        restarted = line(1)
        assert "1 of 2 node(s)" in restarted and "silent: node rank(s) 1" in restarted, restarted
    finally:
        node0.close()
        node1.close()


def test_node0s_line_says_so_when_the_store_does_not_answer() -> None:
    """A store that cannot be reached costs node 0's verdict for the interval, never its line: the
    line says that no verdict came and why; another node's lost write says nothing (node 0 names
    it silent)."""

    def unreachable(host: str, port: int, timeout_s: float) -> StoreClient:
        raise ConnectionRefusedError(111, "Connection refused")

    target = JobLiveTarget("127.0.0.1", free_port(), "lost", 5.0, unreachable)
    lines: list[str] = []
    node0, node1 = JobLive(target, lines.append, None), JobLive(target, lines.append, None)
    try:
        node1.submit(Interval(0, "node1", 1, 2, ()))
        wait_for(lambda: node1.errors == 1, "node 1's write was not tried")
        node0.submit(Interval(0, "node0", 0, 2, ()))
        wait_for(lambda: lines, "node 0 said nothing")
    finally:
        node0.close()
        node1.close()
    assert len(lines) == 1, lines
    assert lines[0].startswith("no verdict this interval: the agents' store at 127.0.0.1:"), lines
    assert "Connection refused" in lines[0] and lines[0].endswith("1 interval(s) lost so far"), lines


class ScriptedStore:
    """A store client whose writes work until told to fail (a stalled or lost store)."""

    def __init__(self, failing: bool) -> None:
        self.failing, self.sets = failing, 0

    def set(self, key: str, value: bytes) -> None:
        if self.failing:
            raise TimeoutError("timed out")
        self.sets += 1

    def check(self, keys: Sequence[str]) -> bool:
        return True

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [b"" for _ in keys]

    def close(self) -> None:
        pass


def test_a_node_holds_one_connection_and_after_an_error_connects_once_more_then_gives_up() -> None:
    """One connection however many intervals; after a lost one, one reconnect at the next interval
    (said); a reconnect that fails ends this node's part (said once): no new connection an interval."""
    opened: list[ScriptedStore] = []
    refuse = [False]

    def connect(host: str, port: int, timeout_s: float) -> StoreClient:
        if refuse[0]:
            raise ConnectionRefusedError(111, "Connection refused")
        opened.append(ScriptedStore(failing=False))
        return opened[-1]

    notes: list[str] = []
    live = JobLive(JobLiveTarget("127.0.0.1", 1, "held", 5.0, connect), lambda text: None, None, None, notes.append)
    done = [0]

    def interval() -> None:  # one interval, handled (written or lost) before the next is given
        before = done[0]
        live.submit(Interval(0, "node1", 1, 2, ()))
        wait_for(lambda: sum(s.sets for s in opened) + live.errors > before, "the interval was not handled")
        done[0] = sum(s.sets for s in opened) + live.errors

    try:
        for _ in range(20):
            interval()
        assert (len(opened), live.connections, notes) == (1, 1, []), notes
        opened[0].failing = True  # the store stops answering: this interval is lost
        interval()
        assert len(opened) == 1 and "connecting again once at the next interval (connection 2 of" in notes[-1]
        for _ in range(5):
            interval()
        assert (len(opened), live.errors) == (2, 1) and opened[1].sets == 5
        opened[1].failing, refuse[0] = True, True  # lost again, and the reconnect is refused
        for _ in range(10):
            interval()
    finally:
        live.close()
    assert live.connections == 3 and live.errors == 11, (live.connections, live.errors)
    assert "gave up on the agents' store at 127.0.0.1:1 (connection 3 of at most 3 failed" in notes[-1], notes
    assert len(notes) == 3, notes


class BehindStore(ScriptedStore):
    """Node 0's key as written; node 1's key behind node 0's windows for its first ``behind_reads`` reads,
    then caught up (node 1's tick came just after node 0's)."""

    def __init__(self, behind: bytes, caught_up: bytes, behind_reads: int) -> None:
        super().__init__(failing=False)
        self.values: dict[str, bytes] = {}
        self.node1 = [behind] * behind_reads + [caught_up]
        self.reads = 0

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        self.reads += 1
        return [
            self.values[k] if k in self.values else self.node1.pop(0) if len(self.node1) > 1 else self.node1[0]
            for k in keys
        ]


def test_node0s_policy_reads_a_node_behind_its_own_windows_again_until_it_catches_up() -> None:
    """Node 0's straggler policy: node 1's summary ends before node 0's own (it wrote just after node 0
    read): node 0 reads node 1's key again and judges the slow windows this interval, not a tick later.
    A node that never catches up costs at most CATCH_UP_READS more reads an interval; without the
    policy, one read an interval."""
    slow_tail = dataclasses.replace(
        _summary(1, 0.01),
        windows=tuple(
            (k, {**w, "@own": 0.03, "forward": 0.03}) if k >= 20 else (k, w) for k, w in _summary(1, 0.01).windows
        ),
    )
    behind = encode_node("node1", 1, 1, encode_ranks([_summary(1, 0.01, windows=20)]))
    caught_up = encode_node("node1", 1, 2, encode_ranks([slow_tail]))
    fast = encode_ranks([_summary(0, 0.01)])

    def run(store: BehindStore, policy: bool, reads: int, judgements: int) -> list[Judged]:
        """Two intervals of node 0 (the first has no tick yet to wait within), each taken once read."""
        judged: list[Judged] = []
        target = JobLiveTarget("127.0.0.1", 1, "behind", 5.0, lambda host, port, timeout_s: store)
        live = JobLive(target, lambda text: None, None, judged.append if policy else None)
        try:
            live.submit(Interval(0, "node0", 0, 2, fast))
            wait_for(lambda: store.reads == 1 and len(judged) == int(policy), "the first interval was not judged")
            live.submit(Interval(0, "node0", 0, 2, fast))
            wait_for(lambda: store.reads >= reads and len(judged) >= judgements, lambda: f"{store.reads} read(s)")
        finally:
            live.close()
        assert live.errors == 0
        return judged

    caught = BehindStore(behind, caught_up, behind_reads=2)
    first, second = run(caught, policy=True, reads=3, judgements=2)
    assert first.node_rank == -1 and second.node == "node1" and second.rank == 1, (first, second)
    assert caught.reads == 3, caught.reads  # the second interval read node 1 once more
    never = BehindStore(behind, behind, behind_reads=0)
    run(never, policy=True, reads=2 + CATCH_UP_READS, judgements=1)
    assert never.reads == 2 + CATCH_UP_READS, never.reads
    plain = BehindStore(behind, caught_up, behind_reads=2)
    run(plain, policy=False, reads=2, judgements=0)
    assert plain.reads == 2, plain.reads
