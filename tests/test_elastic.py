"""Elastic membership (``--nnodes MIN:MAX``, torchrun's c10d line) with real launchers on loopback
and real gloo ranks (tests/elastic_worker.py): a node SIGKILLed (the survivor finishes in a world of
one), a node that joins a running job (both finish in a world of two), a standby that takes a lost
node's rank (the world keeps its size); the worlds in the report; bad input; the membership rules."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest
from cli_runner import invoke
from guards import GUARD_S, wait_for
from host import free_port, listening

from openclaw_launch.agents.membership import ElasticSpec, Member, first_world, next_world, wants_growth

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "elastic_worker.py")


def elastic_line(port: int, nnodes: str = "1:2", last_call_s: float = 1.0, conf: str | None = None) -> list[str]:
    """torchrun's elastic line, verbatim but for the last-call wait (torchrun's default is 30 s)."""
    line = ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "job7"]
    conf = conf or f"last_call_timeout={last_call_s:g}"
    return [*line, "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", conf]


def launcher(args: Sequence[str], tmp_path: Path, name: str, which: str = "openclaw") -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
    environ["PYTHONPATH"] = str(ROOT)
    out, err = (tmp_path / f"{name}.out").open("w"), (tmp_path / f"{name}.err").open("w")
    head = [sys.executable, "-m", "openclaw_launch"] if which == "openclaw" else ["torchrun"]
    proc = subprocess.Popen([*head, *args], cwd=ROOT, env=environ, stdout=out, stderr=err, text=True)
    proc.args = str(tmp_path / f"{name}.err")  # where ``ended`` reads its stderr
    return proc


def world_of_two(
    tmp_path: Path, port: int, line: list[str], report: bool = False
) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Two launchers on ``line`` in a world of two: the first (it hosts the rendezvous on ``port``;
    its report at a.json when ``report``), then the second."""
    first_line = [*line, "--report", str(tmp_path / "a.json")] if report else line
    first = launcher([*first_line, WORKER, "--first-steps", "2000"], tmp_path, "a")
    wait_listening(port)
    second = launcher([*line, WORKER, "--first-steps", "2000"], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    return first, second


def wait_listening(port: int) -> None:
    """The first launcher hosts the rendezvous (torchrun's c10d rule: the first to listen)."""
    wait_for(lambda: listening(port), "the first launcher never listened", poll_s=0.05)


def wait_said(path: Path, text: str) -> None:
    def said() -> str:
        return path.read_text() if path.exists() else ""

    wait_for(lambda: text in said(), lambda: f"{path.name} never said {text!r}: {said()}", poll_s=0.05)


def ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    code = proc.wait(timeout=GUARD_S)
    return code, Path(str(proc.args)).read_text()


def worlds(report: Path) -> list[dict[str, object]]:
    return [e["membership"] for e in json.loads(report.read_text())["attempt_history"]]


@pytest.mark.usefixtures("served_agent_stores")
def test_shrink_a_killed_node_leaves_a_world_of_one(tmp_path: Path) -> None:
    """torchrun completes the same line (the node killed with its workers: a killed torchrun agent
    leaves them running) in 45-50 s with its defaults: benchmarks/elastic_reform.py, RESULTS.md."""
    port = free_port()
    line = [*elastic_line(port, last_call_s=30), "--max-restarts", "3"]
    first, second = world_of_two(tmp_path, port, line, report=True)
    second.send_signal(signal.SIGKILL)  # the launcher only: its guardian kills its workers
    second.wait(GUARD_S)
    code, stderr = ended(first)
    out = (tmp_path / "a.out").read_text()
    assert code == 0, stderr
    assert "is lost" in stderr and "closed its link" in stderr
    assert "size 1 nodes 1 group 0 restart" in out and "done rank 0 size 1 restart" in out
    assert out.count("size 2 nodes 2") == 1  # one world of two (maybe after one of one: MIN is 1), then of one
    history = worlds(tmp_path / "a.json")
    assert [(w["world_size"], len(w["nodes"])) for w in history[-2:]] == [(2, 2), (1, 1)]


@pytest.mark.usefixtures("served_agent_stores")
def test_a_node_whose_ranks_are_renumbered_keeps_its_statistics_and_hang_watch(tmp_path: Path) -> None:
    """Three nodes; node 1 is killed: node 2 becomes node 1 of a world of two and its rank 2 becomes
    rank 1. Its statistics and hang watch follow the new number: the new rank's steps are in its
    report, and the start-up allowance (8 s) does not wait for the old rank 2, which no longer exists
    (it would end a healthy job 124)."""
    port = free_port()
    line = [*elastic_line(port, nnodes="1:3", last_call_s=30), "--max-restarts", "3"]
    line += ["--hang-timeout-s", "30", "--startup-timeout-s", "8"]  # the same on every node (fingerprint)
    work = [WORKER, "--first-steps", "2000", "--steps", "300", "--step-s", "0.04", "--api-steps"]
    first = launcher([*line, "--report", str(tmp_path / "a.json"), *work], tmp_path, "a")
    wait_listening(port)
    others = {
        name: launcher([*line, "--report", str(tmp_path / f"{name}.json"), *work], tmp_path, name) for name in "bc"
    }
    for name in "bc":
        wait_said(tmp_path / f"{name}.out", "size 3")
    third = next(name for name in "bc" if "world rank 2 size 3" in (tmp_path / f"{name}.out").read_text())
    killed = "b" if third == "c" else "c"  # node ranks go by arrival
    others[killed].send_signal(signal.SIGKILL)
    others[killed].wait(GUARD_S)
    (code_a, err_a), (code_c, err_c) = ended(first), ended(others[third])
    assert (code_a, code_c) == (0, 0), err_a + err_c
    assert "world rank 1 size 2 nodes 2 group 1 restart 1" in (tmp_path / f"{third}.out").read_text()
    assert "openclaw-launch: hang" not in err_c
    ranks = {r["rank"]: r for r in json.loads((tmp_path / f"{third}.json").read_text())["ranks"]}
    assert 1 in ranks and ranks[1]["statistics"]["steps"] >= 250, ranks


def test_plan_of_an_elastic_job_says_that_each_world_has_its_own() -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "plan", *elastic_line(port, nnodes="1:4"), WORKER],
        capture_output=True, text=True, timeout=GUARD_S, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "elastic job (1:4 nodes): this is the plan in a world of 1 node(s); run builds each world's own" in (
        proc.stderr
    )


@pytest.mark.usefixtures("served_agent_stores")
def test_fewer_than_min_left_ends_the_job_as_a_lost_node(tmp_path: Path) -> None:
    port = free_port()
    line = [*elastic_line(port, nnodes="2:3", last_call_s=0), "--max-restarts", "3"]
    first, second = world_of_two(tmp_path, port, line)
    second.send_signal(signal.SIGKILL)
    second.wait(GUARD_S)
    code, stderr = ended(first)
    assert code == 1, stderr
    assert "no next world: 1 node(s) left, fewer than MIN (--nnodes 2:3)" in stderr
    assert "size 1" not in (tmp_path / "a.out").read_text()


def test_the_first_node_lost_ends_the_job_on_the_others(tmp_path: Path) -> None:
    """It hosts the rendezvous (torchrun's c10d host too): no next world, exit 1, no restart."""
    port = free_port()
    line = [*elastic_line(port, last_call_s=30), "--max-restarts", "3"]
    first, second = world_of_two(tmp_path, port, line)
    first.send_signal(signal.SIGKILL)
    first.wait(GUARD_S)
    code, stderr = ended(second)
    assert code == 1 and "lost the first node node0's agent" in stderr, stderr
    assert "attempt 2/" not in stderr


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]


def test_shrink_a_node_that_stops_answering_is_lost_after_the_keepalive(tmp_path: Path) -> None:
    """A cut link closes nothing: the frozen node (SIGSTOP, every process of it) is lost after
    --keepalive-s, and is not taken back in at a later re-forming."""
    port = free_port()
    line = [*elastic_line(port, last_call_s=30), "--max-restarts", "3", "--keepalive-s", "2"]
    first, second = world_of_two(tmp_path, port, line, report=True)
    frozen = tree(second.pid)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        code, stderr = ended(first)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        second.wait(GUARD_S)
    assert code == 0, stderr
    assert "no keep-alive" in stderr
    assert "done rank 0 size 1 restart" in (tmp_path / "a.out").read_text()
    assert [w["world_size"] for w in worlds(tmp_path / "a.json")][-2:] == [2, 1]


@pytest.mark.usefixtures("served_agent_stores")
def test_grow_a_node_that_arrives_is_taken_in(tmp_path: Path) -> None:
    port = free_port()
    line = [*elastic_line(port, last_call_s=0.2), "--max-restarts", "2"]
    first = launcher([*line, WORKER, "--want", "2"], tmp_path, "a")
    wait_said(tmp_path / "a.out", "size 1 nodes 1")  # running alone: MIN is 1
    second = launcher([*line, "--report", str(tmp_path / "b.json"), WORKER, "--want", "2"], tmp_path, "b")
    (code_a, err_a), (code_b, err_b) = ended(first), ended(second)
    assert (code_a, code_b) == (0, 0), err_a + err_b
    assert "a node joined" in err_a
    assert "failure class reform" in err_a and "failure class remote" not in err_a  # growth is no failure
    assert "done rank 0 size 2 restart 1" in (tmp_path / "a.out").read_text()
    assert "done rank 1 size 2 restart 1" in (tmp_path / "b.out").read_text()
    # taken in at the job's attempt 1: its only attempt is world 1, TORCHELASTIC_RESTART_COUNT 1
    assert [(w["world"], w["node_rank"], w["world_size"]) for w in worlds(tmp_path / "b.json")] == [(1, 1, 2)]


@pytest.mark.usefixtures("served_agent_stores")
def test_a_standby_takes_the_lost_nodes_rank(tmp_path: Path) -> None:
    port = free_port()
    line = [*elastic_line(port, last_call_s=30), "--max-restarts", "2"]  # MAX arrives: no last-call wait
    first = launcher([*line, "--report", str(tmp_path / "a.json"), WORKER, "--first-steps", "2000"], tmp_path, "a")
    wait_listening(port)
    standby = launcher([*line, "--standby", WORKER, "--first-steps", "2000"], tmp_path, "s")
    second = launcher([*line, WORKER, "--first-steps", "2000"], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    assert (tmp_path / "s.out").read_text() == ""  # a standby runs no ranks
    second.send_signal(signal.SIGKILL)
    second.wait(GUARD_S)
    (code_a, err_a), (code_s, err_s) = ended(first), ended(standby)
    assert (code_a, code_s) == (0, 0), err_a + err_s
    assert "world rank 1 size 2 nodes 2 group 1 restart 1" in (tmp_path / "s.out").read_text()
    history = worlds(tmp_path / "a.json")
    assert [(w["world"], w["world_size"]) for w in history] == [(0, 2), (1, 2)]
    assert history[0]["nodes"][1] != history[1]["nodes"][1]  # rank 1 is another launcher: the standby


ELASTIC_CONFIG = """
cluster:
  nodes:
    - {name: node0, ip: 127.0.0.1, cpu_workers: 1}
    - {name: node1, ip: 127.0.0.1, cpu_workers: 1}
    - {name: node2, ip: 127.0.0.1, cpu_workers: 1}
runtime:
  binding: none
  min_nodes: 1
  max_nodes: 2
  standby_nodes: [node2]
"""


@pytest.mark.usefixtures("served_agent_stores")
def test_from_a_config_the_standby_node_takes_the_lost_nodes_rank(tmp_path: Path) -> None:
    """The same from --config: runtime.min_nodes/max_nodes, node2 a standby by runtime.standby_nodes."""
    config = tmp_path / "cluster.yaml"
    config.write_text(ELASTIC_CONFIG)
    master, agent = free_port(), free_port()
    line = ["--config", str(config), "--master-port", str(master), "--agent-port", str(agent), "--max-restarts", "2"]
    first = launcher(
        [*line, "--node", "node0", "--report", str(tmp_path / "a.json"), WORKER, "--first-steps", "2000"], tmp_path, "a"
    )
    wait_listening(agent)
    standby = launcher([*line, "--node", "node2", WORKER, "--first-steps", "2000"], tmp_path, "s")
    second = launcher([*line, "--node", "node1", WORKER, "--first-steps", "2000"], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    second.send_signal(signal.SIGKILL)
    second.wait(GUARD_S)
    (code_a, err_a), (code_s, err_s) = ended(first), ended(standby)
    assert (code_a, code_s) == (0, 0), err_a + err_s
    assert "world rank 1 size 2 nodes 2 group 1 restart 1" in (tmp_path / "s.out").read_text()
    assert [w["world_size"] for w in worlds(tmp_path / "a.json")][-2:] == [2, 2]


def test_config_elastic_keys_are_checked(tmp_path: Path) -> None:
    for bad, says in (
        ("  min_nodes: 2\n  max_nodes: 2\n", "min_nodes 2 must be below max_nodes 2"),
        ("  min_nodes: 1\n", "go together"),
        ("  min_nodes: 1\n  max_nodes: 5\n", "runtime.max_nodes"),
        ("  min_nodes: 1\n  max_nodes: 2\n  standby_nodes: [node9]\n", "'node9' is not in cluster.nodes"),
        ("  standby_nodes: [node1]\n", "standby_nodes need an elastic job"),
    ):
        config = tmp_path / "c.yaml"
        config.write_text(ELASTIC_CONFIG.split("  min_nodes")[0] + bad)
        proc = invoke("--config", str(config), "--node", "node0", "--no-python", "true")
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, (bad, proc.stderr)


@pytest.mark.usefixtures("served_agent_stores")
def test_a_standby_not_needed_exits_0_when_the_job_ends(tmp_path: Path) -> None:
    port = free_port()
    go = tmp_path / "go"
    first = launcher([*elastic_line(port, last_call_s=0), WORKER, "--until", str(go)], tmp_path, "a")
    wait_listening(port)
    standby = launcher([*elastic_line(port), "--standby", WORKER], tmp_path, "s")
    wait_said(tmp_path / "a.err", "standby")  # it joined while the job ran
    go.touch()  # the job ends
    (code_a, err_a), (code_s, err_s) = ended(first), ended(standby)
    assert (code_a, code_s) == (0, 0), err_a + err_s
    assert "ran no ranks" in err_s and (tmp_path / "s.out").read_text() == ""


@pytest.mark.usefixtures("served_agent_stores")
@pytest.mark.parametrize(
    ("host_nnodes", "joiner_nnodes", "says"),
    [("1:2", "2", "is elastic (--nnodes 1:2, --rdzv-id job7)"), ("2", "1:2", "is not elastic")],
)
def test_a_launcher_of_the_other_kind_is_refused(
    tmp_path: Path, host_nnodes: str, joiner_nnodes: str, says: str
) -> None:
    """An elastic launcher at a fixed-size job's rendezvous, or the other way round: exit 2, the
    waiting first node untouched."""
    port = free_port()
    host = launcher([*elastic_line(port, nnodes=host_nnodes, last_call_s=60), WORKER], tmp_path, "a")
    wait_listening(port)
    joiner = launcher([*elastic_line(port, nnodes=joiner_nnodes), WORKER], tmp_path, "b")
    code, stderr = ended(joiner)
    assert code == 2 and says in stderr, stderr
    assert host.poll() is None
    host.send_signal(signal.SIGTERM)
    host.wait(GUARD_S)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--nnodes", "3:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9"], "--nnodes"),
        (["--nnodes", "0:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9"], "--nnodes"),
        (["--nnodes", "a:b", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9"], "--nnodes"),
        (["--nnodes", "1:2"], "--nnodes"),  # static: no rendezvous
        (["--nnodes", "1:2", "--rdzv-backend", "c10d"], "--rdzv-endpoint"),
        (["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--node-rank", "1"], "--node-rank"),
        (
            [
                "--nnodes",
                "1:2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "h:9",
                "--rdzv-conf",
                "last_call_timeout=x",
            ],
            "--rdzv-conf",
        ),
        (["--nnodes", "2", "--node-rank", "1", "--standby"], "--standby"),
        (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--standby"], "--standby"),
        (["--nnodes", "1:1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--standby"], "--standby"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_input_exits_2_naming_the_option(tmp_path: Path, args: list[str], says: str) -> None:
    marker = tmp_path / "started"
    line = [*args, "--no-python", "touch", str(marker)]
    if says == "--rdzv-endpoint":  # through the entry point
        cmd = [sys.executable, "-m", "openclaw_launch", *line]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S)
    else:
        proc = invoke(*line)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()


def test_bad_config_line_with_elastic_nnodes() -> None:
    line = ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:9", "--no-python", "true"]
    proc = invoke("--config", str(ROOT / "configs" / "h200x2.yaml"), *line)
    assert proc.returncode == 2 and "--nnodes" in proc.stderr and "Traceback" not in proc.stderr


SPEC = ElasticSpec(min_nodes=1, max_nodes=3, last_call_timeout_s=0)


def test_first_world_is_the_active_members_by_arrival_up_to_max() -> None:
    members = [
        Member(0, "a", False),
        Member(1, "s", True),
        Member(2, "b", False),
        Member(3, "c", False),
        Member(4, "d", False),
    ]
    assert first_world(members, SPEC) == (0, 2, 3)


def test_a_standby_takes_the_lost_rank_else_the_ranks_close_up() -> None:
    standby, late = Member(5, "s", True), Member(6, "late", False)
    assert next_world((0, 1, 2), {1}, [standby], SPEC) == (0, 5, 2)  # same size, rank 1 kept
    assert next_world((0, 1, 2), {1}, [], SPEC) == (0, 2)  # ranks 0..n-1
    assert next_world((0, 1), set(), [late, standby], SPEC) == (0, 1, 6)  # a standby waits while nobody is lost
    assert next_world((0, 1, 2), set(), [late], SPEC) == (0, 1, 2)  # at MAX: the late one waits
    assert wants_growth((0, 1), [late], SPEC) and not wants_growth((0, 1), [standby], SPEC)
    assert not wants_growth((0, 1, 2), [late], SPEC)
