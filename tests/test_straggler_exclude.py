"""``--on-straggler exclude`` end to end (issue 28): real launchers on loopback, real gloo ranks
(tests/straggle_worker.py, which checkpoints at the launcher's request and resumes from it). Three nodes
and a standby, one node slowed by a sleep in its input: it is taken out and the standby takes its rank,
the job finishes with every step accounted for; the same without a standby: the world shrinks; a node
slow for a moment is not taken out. Plus every node's checkpoint request and grace, and bad input (exit 2
before anything starts). The decision itself: tests/test_straggler_policy.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from host import free_port, listening

from openclaw_launch import exit_codes
from openclaw_launch.agents.fate import AgentOptions, Fate
from openclaw_launch.agents.straggler_actions import StragglerActions
from openclaw_launch.agents.straggler_policy import Exclude, StragglerSettings
from openclaw_launch.report.membership import Exclusion
from openclaw_launch.stats.judged import Judged

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "straggle_worker.py")
EXCLUDE = StragglerSettings(policy="exclude", intervals=3, exclude_pct=10.0, cooldown_intervals=5)
# Short live intervals and grace: the job is judged, excluded and re-formed in seconds. One exclusion
# per job (the cooldown is the pure test's): a loaded box never makes a second one.
POLICY = ["--on-straggler", "exclude", "--straggler-intervals", "2", "--straggler-grace-s", "0.5"]
POLICY += ["--stats-interval-s", "0.5", "--straggler-cooldown-intervals", "1000"]
POLICY += ["--grace-period-s", "5"]  # should a worker outlive SIGTERM again (fixed: 066f076), 5 s lost, not 30


def elastic_line(port: int, nnodes: str) -> list[str]:
    line = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "slow"]
    return [*line, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=30", "--max-restarts", "2"]


def launcher(args: Sequence[str], tmp_path: Path, name: str, env: Mapping[str, str] = {}) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC", "STRAGGLE"))}
    environ.update(PYTHONPATH=str(ROOT), **env)
    out, err = (tmp_path / f"{name}.out").open("w"), (tmp_path / f"{name}.err").open("w")
    command = [sys.executable, "-m", "openclaw_launch", *args]
    return subprocess.Popen(command, cwd=ROOT, env=environ, stdout=out, stderr=err, text=True)


def said(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.out").read_text() + (tmp_path / f"{name}.err").read_text()


def job(tmp_path: Path, nnodes: str, nodes: Mapping[str, Mapping[str, str]], steps: int) -> dict[str, int]:
    """The host ``a`` first, then each of ``nodes`` (name -> its environment; ``standby`` in the name: a
    standby) in order; every launcher's exit code once all ended."""
    port = free_port()
    ckpt = str(tmp_path / "ckpt")
    line = [*elastic_line(port, nnodes), *POLICY]
    work = [WORKER, "--steps", str(steps), "--ckpt", ckpt]
    host = ["--report", str(tmp_path / "a.json"), "--exclude-file", str(tmp_path / "exclude.txt")]
    procs = {"a": launcher([*line, *host, *work], tmp_path, "a")}
    wait_for(lambda: listening(port), "the host never listened", poll_s=0.05)
    try:
        for name, env in nodes.items():
            extra = ["--standby"] if "standby" in name else []
            procs[name] = launcher([*line, *extra, *work], tmp_path, name, env)
            if "standby" in name:  # it waits before the first world forms (MAX active members start it)
                wait_for(lambda: "standby" in said(tmp_path, "a"), "the standby never joined", poll_s=0.05)
        return {name: p.wait(timeout=4 * GUARD_S) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def checkpoints_and_resumes(text: str) -> tuple[list[int], list[int]]:
    return [int(s) for s in re.findall(r"checkpoint (\d+)", text)], [int(s) for s in re.findall(r"resumed (\d+)", text)]


@pytest.mark.usefixtures("served_agent_stores")
def test_three_nodes_and_a_standby_the_slow_node_is_taken_out_and_replaced(tmp_path: Path) -> None:
    slow = {"STRAGGLE_MS": "60"}
    codes = job(tmp_path, "2:3", {"standby": {}, "b": slow, "c": {}}, steps=160)
    host = said(tmp_path, "a")
    assert codes["a"] == 0 and codes["c"] == 0 and codes["standby"] == 0, host
    assert "straggler policy: taking node node" in host and "checkpoint request: SIGUSR1" in host, host
    verified = r"straggler policy: after excluding node \S+: a standby holds its node rank \d \(node \S+\).*verified"
    assert re.search(verified, host), host
    assert codes["b"] == exit_codes.TAKEN_OUT and "runs no more ranks" in said(tmp_path, "b"), said(tmp_path, "b")
    assert "done 160" in said(tmp_path, "standby")  # the standby ran the excluded node's rank to the end
    checkpoints, resumes = checkpoints_and_resumes(host)
    assert resumes[0] == 0 and resumes[1] == checkpoints[0] > 0  # every step: the next world resumed there
    assert "done 160" in host
    report = json.loads((tmp_path / "a.json").read_text())
    history = report["attempt_history"]
    assert [h["membership"]["world_size"] for h in history] == [3, 3]
    [excluded] = history[1]["membership"]["excluded"]
    assert excluded["reason"] == "straggler" and "live intervals in a row" in excluded["evidence"]
    assert "the next world: no straggler" in excluded["evidence"] or "the next world: straggler" in excluded["evidence"]
    assert socket.gethostname() in (tmp_path / "exclude.txt").read_text()  # --exclude-file: the launcher's host
    assert excluded["step_time_before_s"] > excluded["step_time_after_s"] > 0
    assert history[0]["failure"]["failure_class"] == "exclude"  # no failure: its own class
    [once] = json.loads((tmp_path / "a-job.json").read_text())["exclusions"]  # every node's record, one entry
    assert once["step_time_after_s"] == excluded["step_time_after_s"]  # the first node's: it verified it


@pytest.mark.usefixtures("served_agent_stores")
def test_without_a_standby_the_world_shrinks_within_min(tmp_path: Path) -> None:
    codes = job(tmp_path, "1:2", {"b": {"STRAGGLE_MS": "60"}}, steps=120)
    host = said(tmp_path, "a")
    assert codes == {"a": 0, "b": exit_codes.TAKEN_OUT}, host
    assert re.search(r"after excluding node \S+: a smaller world", host), host
    report = json.loads((tmp_path / "a.json").read_text())
    assert [h["membership"]["world_size"] for h in report["attempt_history"]] == [2, 1]
    checkpoints, resumes = checkpoints_and_resumes(host)
    assert resumes[1] == checkpoints[0] and "done 120" in host


@pytest.mark.usefixtures("served_agent_stores")
def test_a_node_slow_for_a_moment_is_not_taken_out(tmp_path: Path) -> None:
    flap = {"STRAGGLE_MS": "60", "STRAGGLE_FROM": "40", "STRAGGLE_UNTIL": "45"}
    codes = job(tmp_path, "1:2", {"b": flap}, steps=120)
    host = said(tmp_path, "a")
    assert codes == {"a": 0, "b": 0}, host
    assert "taking node" not in host and "checkpoint request" not in host
    report = json.loads((tmp_path / "a.json").read_text())
    assert len(report["attempt_history"]) == 1 and not report.get("exclusions")


def test_every_node_sends_the_checkpoint_signal_once_then_waits_the_grace() -> None:
    sent: list[tuple[int, int]] = []
    lines: list[str] = []
    now = [100.0]
    actions = StragglerActions(EXCLUDE, lines.append, lambda pid, sig: sent.append((pid, sig)), lambda: now[0])
    actions.on_spawn(41)
    actions.on_spawn(42)
    named = Judged(0, True, 0.12, "node1", 1, 1, 30.0, "input", "host")
    fate = StragglerActions(EXCLUDE, print).fate_of(Exclude("node1", 1, 0, (named,) * 3, 0.1))
    assert (fate.kind, fate.node, fate.signal, fate.grace_s) == ("exclude", "node1", signal.SIGUSR1, 30.0)
    assert actions.stop_due_in_s() is None  # no request yet: nothing comes due
    assert actions.stop_reason(fate) is None
    assert actions.stop_due_in_s() == 30.0  # the supervisor's loop wakes at the grace's end
    now[0] += 29.0
    assert actions.stop_reason(fate) is None and actions.stop_due_in_s() == 1.0
    now[0] += 1.0
    assert actions.stop_due_in_s() == 0.0
    stop = actions.stop_reason(fate)
    assert stop is not None and stop.restartable and stop.evidence is not None and stop.evidence.stop == "exclude"
    assert sent == [(41, signal.SIGUSR1), (42, signal.SIGUSR1)]  # once, to each worker's group
    assert len(lines) == 1 and "SIGUSR1 to this node's 2 worker(s)" in lines[0]


CONFIG = """\
cluster:
  nodes:
    - {name: node0, ip: 127.0.0.1, cpu_workers: 1}
    - {name: node1, ip: 127.0.0.1, cpu_workers: 1}
runtime:
  binding: none
  straggler_policy: exclude
"""


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "openclaw_launch", "plan", *args, "x.py"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nproc-per-node", "1", "--on-straggler", "exclude"], "this job is not one"),
        (
            ["--nnodes", "2:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--on-straggler", "exclude"],
            "N:N is a fixed-size job",
        ),
        (
            ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--on-straggler", "exclude"],
            "--max-restarts 1 or more",
        ),
        (
            [
                *("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--max-restarts", "1"),
                *("--on-straggler", "exclude", "--stats-interval-s", "0"),
            ],
            "--stats-interval-s other than 0",
        ),
        (["--nproc-per-node", "1", "--straggler-intervals", "1"], "--straggler-intervals"),
        (["--nproc-per-node", "1", "--straggler-exclude-pct", "0"], "--straggler-exclude-pct"),
        (["--nproc-per-node", "1", "--checkpoint-signal", "USR1,USR2"], "give one signal"),
        (["--nproc-per-node", "1", "--on-straggler", "drop"], "--on-straggler"),
    ],
)
def test_bad_input_is_exit_2_naming_the_option_before_anything_starts(args: list[str], says: str) -> None:
    done = plan(*args)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_config_key_is_refused_with_its_line_when_the_job_is_not_elastic(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    done = plan("--config", str(config), "--node", "node0")
    assert done.returncode == 2 and "runtime.straggler_policy (line 7)" in done.stderr, done.stderr
    assert "give min_nodes and max_nodes" in done.stderr and "Traceback" not in done.stderr
    config.write_text(CONFIG.replace("exclude", "exclude\n  min_nodes: 1\n  max_nodes: 2"))
    done = plan("--config", str(config), "--node", "node0")  # elastic, but no restart for the re-forming
    assert done.returncode == 2 and "runtime.straggler_policy" in done.stderr and "--max-restarts" in done.stderr
    config.write_text(CONFIG.replace("exclude", "exclude\n  straggler_intervals: 1"))
    done = plan("--config", str(config), "--node", "node0")
    assert done.returncode == 2 and "runtime.straggler_intervals (line 8)" in done.stderr, done.stderr


class FakeAgent:
    """What StragglerActions uses of the elastic agent (straggler_actions.ExcludingAgent)."""

    def __init__(self, nodes: tuple[str, ...]) -> None:
        self.is_host = True
        self.opt = AgentOptions("127.0.0.1", 1, nodes)
        self.exclusions: list[Exclusion] = []
        self.asked: list[tuple[int, str]] = []
        self.taken: list[tuple[int, str, str, float | None]] = []

    @property
    def elastic_link(self) -> FakeAgent:
        return self

    def ask_exclude(self, node_rank: int, fate: str) -> None:
        self.asked.append((node_rank, fate))

    def take_out(self, node_rank: int, reason: str, evidence: str, step_time_before_s: float | None = None) -> None:
        self.taken.append((node_rank, reason, evidence, step_time_before_s))
        self.exclusions.append(Exclusion("h1", "h1", reason, evidence, 0, 0.0, step_time_before_s))


def test_node_0_asks_takes_out_and_completes_the_record_and_a_refusal_starts_the_count_again() -> None:
    lines: list[str] = []
    settings = StragglerSettings(policy="exclude", intervals=2, cooldown_intervals=1)
    actions = StragglerActions(settings, lines.append, lambda pid, sig: None)
    agent = FakeAgent(("node0", "node1", "node2"))
    slow = Judged(0, True, 0.08, "node1", 1, 1, 70.0, "input", "input")
    actions.observe(slow, agent)
    actions.observe(slow, agent)
    assert [rank for rank, _ in agent.asked] == [1] and "taking node node1 (node rank 1) out" in lines[-1]
    actions.refused("1 node(s) would be left")
    assert "node node1 stays: 1 node(s) would be left" in lines[-1]
    actions.observe(slow, agent)  # the count starts again: one interval is not enough
    assert len(agent.asked) == 1
    actions.observe(slow, agent)
    fate = Fate.from_json(agent.asked[-1][1])
    assert len(agent.asked) == 2 and fate.kind == "exclude" and fate.node == "node1"
    actions.fate_came(fate, agent)
    [(rank, reason, evidence, before)] = agent.taken
    assert (rank, reason, before) == (1, "straggler", 0.08) and "2 live intervals in a row" in evidence
    assert actions.observe(slow, agent) is None  # the stopping world's last lines do not count
    agent.opt = AgentOptions("127.0.0.1", 1, ("node0", "node1", "node2"))  # a standby took rank 1
    verified = actions.observe(Judged(1, True, 0.02), agent)
    assert verified is not None and agent.exclusions[0].step_time_after_s == 0.02
    assert agent.exclusions[0].evidence.endswith("; the next world: no straggler")
    assert "a standby holds its node rank 1 (node node1)" in lines[-1] and "verified" in lines[-1]


def test_at_loglevel_info_node_0_says_each_judged_interval_in_one_line() -> None:
    lines: list[str] = []
    actions = StragglerActions(StragglerSettings(policy="exclude", intervals=2), lines.append, lambda pid, sig: None)
    agent = FakeAgent(("node0", "node1", "node2"))
    slow = Judged(0, True, 0.08, "node1", 1, 1, 70.0, "input", "input")
    actions.observe(Judged(0, False, None), agent)
    assert lines == []  # LOGLEVEL above INFO: only the actions are said
    actions.info = True
    for judged in (Judged(0, False, None), Judged(0, True, 0.02), slow, slow, slow):
        actions.observe(judged, agent)
    info = [line for line in lines if "info:" in line]
    prefix = "openclaw-launch: info: straggler policy: world 0 interval"
    assert info == [
        f"{prefix} 2: too few steps to judge, no step yet; 0 of 2 in a row",
        f"{prefix} 3: no straggler, step p50 20.0 ms; 0 of 2 in a row",
        f"{prefix} 4: straggler: node node1 rank 1 (input, input) +70 %, step p50 80.0 ms; 1 of 2 in a row",
        f"{prefix} 5: straggler: node node1 rank 1 (input, input) +70 %, step p50 80.0 ms; 2 of 2 in a row",
        f"{prefix}: straggler: node node1 rank 1 (input, input) +70 %, step p50 80.0 ms; not counted: the world stops",
    ], info
    assert "taking node node1 (node rank 1) out" in lines[-2]  # the decision's own line, between them
