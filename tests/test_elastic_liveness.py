"""Issue 32's reproductions against an elastic job's agents, with real launchers on loopback and real
gloo ranks (tests/elastic_worker.py, the harness of tests/test_elastic.py):

- an outsider at the first node's liveness port (``1`` and a close, an HTTP probe, ``999`` held
  open) expels nobody, kills no thread, blocks no lock: a node that arrives later is taken in;
- a launcher of another ``--rdzv-id`` at the same endpoint, and one whose variables differ, are
  refused (exit 2) before the running world hears of them;
- a launcher that is frozen (SIGSTOP: its helper process runs on) is lost after ``--keepalive-s``;
- a standby that does not answer when it is needed is skipped, and the world re-forms without it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

import psutil
import pytest
from guards import GUARD_S, wait_for
from host import free_port
from test_elastic import ELASTIC_CONFIG, WORKER, elastic_line, ended, launcher, tree, wait_listening, wait_said


def liveness_port(launcher_pid: int, store_port: int) -> int:
    """The first node's liveness port: its agent helper's listening socket that is not the store's."""

    def found() -> int | None:
        for child in psutil.Process(launcher_pid).children():
            with contextlib.suppress(psutil.Error):
                if child.name() == "openclaw-agent":
                    ports = [
                        c.laddr.port
                        for c in child.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN and c.laddr.port != store_port
                    ]
                    if ports:
                        return int(ports[0])
        return None

    wait_for(lambda: found() is not None, "the first node's liveness port never listened", poll_s=0.05)
    port = found()
    assert port is not None
    return port


def send(port: int, data: bytes, keep: bool = False) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(data)
    if not keep:
        sock.close()
    return sock


def kill_tree(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.usefixtures("served_agent_stores")
def test_an_outsider_at_the_liveness_port_expels_nobody_and_a_later_node_is_taken_in(tmp_path: Path) -> None:
    """``1`` held open until member 1 arrives and then closed once expelled it; an HTTP probe killed
    the port's thread (no node could join after it); ``999`` blocked the rendezvous lock."""
    port = free_port()
    line = [*elastic_line(port, last_call_s=0), "--max-restarts", "2"]
    work = [WORKER, "--want", "2", "--steps", "60", "--step-s", "0.05"]  # the world of two runs ~3 s
    first = launcher([*line, *work], tmp_path, "a")
    wait_said(tmp_path / "a.out", "size 1 nodes 1")
    live = liveness_port(first.pid, port)
    one = send(live, b"1\n", keep=True)
    send(live, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    held = send(live, b"999\n", keep=True)
    second = launcher([*line, *work], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    one.close()
    (code_a, err_a), (code_b, err_b) = ended(first), ended(second)
    held.close()
    assert (code_a, code_b) == (0, 0), err_a + err_b
    assert "is lost" not in err_a and "Traceback" not in err_a
    assert "liveness port: dropped a connection" in err_a and "never trusted" in err_a
    assert "the liveness port dropped" in err_a  # the count, at the end
    assert "a node joined" in err_a and "done rank 0 size 2 restart 1" in (tmp_path / "a.out").read_text()


@pytest.mark.usefixtures("served_agent_stores")
def test_another_jobs_launcher_and_a_differing_node_are_refused_before_the_running_world_hears(
    tmp_path: Path,
) -> None:
    port = free_port()
    go = tmp_path / "go"
    line = [*elastic_line(port, last_call_s=0), "--max-restarts", "2"]
    first = launcher([*line, WORKER, "--until", str(go)], tmp_path, "a")
    wait_said(tmp_path / "a.out", "size 1 nodes 1")
    other_id = [("job8" if arg == "job7" else arg) for arg in line]
    stray = launcher([*other_id, WORKER], tmp_path, "x")
    code, err = ended(stray)
    assert code == 2 and "--rdzv-id job8, but the job at" in err and "another job's rendezvous" in err, err
    os.environ["NCCL_ALGO"] = "Ring"  # the launcher's environment, which its ranks inherit
    try:
        differing = launcher([*line, WORKER], tmp_path, "d")
    finally:
        del os.environ["NCCL_ALGO"]
    code, err = ended(differing)
    assert code == 2 and "env.NCCL_ALGO = 'Ring'" in err and "untouched" in err and "Traceback" not in err, err
    assert first.poll() is None  # the running world never stopped
    go.touch()
    code, err_a = ended(first)
    assert code == 0, err_a
    assert "refused the launcher" in err_a and "a node joined" not in err_a
    out = (tmp_path / "a.out").read_text()
    assert "restart 1" not in out and "done rank 0 size 1 restart 0" in out


@pytest.mark.usefixtures("served_agent_stores")
def test_a_frozen_launcher_whose_helper_runs_on_is_lost_after_the_keepalive(tmp_path: Path) -> None:
    """SIGSTOP on the launcher only: its agent helper (another process) and its ranks run on; the
    keep-alive is the launcher's loop's, so the first node finds it lost and goes on alone."""
    port = free_port()
    line = [*elastic_line(port, last_call_s=30), "--max-restarts", "3", "--keepalive-s", "2"]
    first = launcher([*line, WORKER, "--first-steps", "2000"], tmp_path, "a")
    wait_listening(port)
    second = launcher([*line, WORKER, "--first-steps", "2000"], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    everything = tree(second.pid)
    os.kill(second.pid, signal.SIGSTOP)
    try:
        code, err = ended(first)
    finally:
        kill_tree(everything)
        second.wait(GUARD_S)
    assert code == 0, err
    assert "no keep-alive" in err
    assert "done rank 0 size 1 restart" in (tmp_path / "a.out").read_text()


@pytest.mark.usefixtures("served_agent_stores")
def test_a_standby_that_does_not_answer_is_skipped_and_the_world_reforms_with_who_is_there(tmp_path: Path) -> None:
    port = free_port()
    line = [*elastic_line(port, last_call_s=30), "--max-restarts", "2", "--keepalive-s", "2"]
    first = launcher([*line, WORKER, "--first-steps", "2000"], tmp_path, "a")
    wait_listening(port)
    standby = launcher([*line, "--standby", WORKER, "--first-steps", "2000"], tmp_path, "s")
    wait_said(tmp_path / "a.err", "standby")
    second = launcher([*line, WORKER, "--first-steps", "2000"], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    everything = tree(standby.pid)
    os.kill(standby.pid, signal.SIGSTOP)  # its helper still holds its liveness link open
    second.send_signal(signal.SIGKILL)
    second.wait(GUARD_S)
    try:
        code, err = ended(first)
    finally:
        kill_tree(everything)
        standby.wait(GUARD_S)
    assert code == 0, err
    assert "did not answer within 2 s (--keepalive-s): skipped" in err
    assert "done rank 0 size 1 restart 1" in (tmp_path / "a.out").read_text()


@pytest.mark.usefixtures("served_agent_stores")
def test_a_second_launcher_for_a_config_node_is_refused_at_once_and_the_job_runs(tmp_path: Path) -> None:
    """Issue 32 item 9: the second launcher for node1 of an elastic config job waited out the whole
    agent timeout; it is refused at admission (exit 2) and the job runs on."""
    config = tmp_path / "cluster.yaml"
    config.write_text(ELASTIC_CONFIG)
    master, agent = free_port(), free_port()
    line = ["--config", str(config), "--master-port", str(master), "--agent-port", str(agent), "--max-restarts", "1"]
    work = [WORKER, "--steps", "100", "--step-s", "0.05"]  # ~5 s in the world of two
    first = launcher([*line, "--node", "node0", *work], tmp_path, "a")
    wait_listening(agent)
    second = launcher([*line, "--node", "node1", *work], tmp_path, "b")
    wait_said(tmp_path / "b.out", "size 2")
    again = launcher([*line, "--node", "node1", "--agent-timeout-s", "300", WORKER], tmp_path, "c")
    code, err = ended(again)
    assert code == 2 and "node node1 already joined this job" in err and "untouched" in err, err
    assert first.poll() is None and second.poll() is None  # refused before the running world heard of it
    (code_a, err_a), (code_b, err_b) = ended(first), ended(second)
    assert (code_a, code_b) == (0, 0), err_a + err_b
