"""One thread at fork (issue 16): every fork and spawn of the real launcher happens while it has one
thread, in Python's view and in the kernel's, and its helper processes (run/helper.py) never
outlive it, also when it is SIGKILLed.

The launcher runs with an audit hook, installed by a ``sitecustomize.py`` on its PYTHONPATH: on
``os.fork``, ``os.posix_spawn``, ``os.exec``, ``subprocess.Popen`` in the launcher's own process
(not in a forked helper, not in a worker: the hook checks the pid, and takes its output path out
of the environment the workers inherit) it records ``threading.active_count()`` and the entries
of /proc/self/task.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from guards import GUARD_S, wait_for
from host import free_port, needs_torch

ROOT = Path(__file__).resolve().parent.parent
FAKE = [sys.executable, str(ROOT / "tests" / "fake_worker.py")]
SECTIONS = str(ROOT / "tests" / "telemetry_workers" / "sections.py")
CONFIG = ROOT / "configs" / "two-nodes-loopback.yaml"
AUDIT_ENV = "OPENCLAW_TEST_FORK_AUDIT"

SITECUSTOMIZE = f"""
import os, sys

_out = os.environ.pop({AUDIT_ENV!r}, None)  # the workers do not inherit it
if _out:
    import json, threading

    _pid = os.getpid()
    _events = ("os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp", "os.spawn", "os.exec", "subprocess.Popen")

    def _comm(tid):
        try:
            with open(f"/proc/self/task/{{tid}}/comm") as f:
                return f.read().strip()
        except OSError:
            return "?"

    def _audit(event, args):
        if event not in _events or os.getpid() != _pid:  # a forked helper's own events are not ours
            return
        record = {{
            "pid": _pid,
            "event": event,
            "python_threads": threading.active_count(),
            "thread_names": [t.name for t in threading.enumerate()],
            "os_threads": len(os.listdir("/proc/self/task")),
            "os_thread_names": [_comm(t) for t in os.listdir("/proc/self/task")],
            "what": repr(args)[:300],
        }}
        with open(_out, "a") as f:
            f.write(json.dumps(record) + "\\n")

    sys.addaudithook(_audit)
"""


def _audited_env(tmp: Path, out: Path) -> dict[str, str]:
    site = tmp / "audit-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": f"{site}:{ROOT}", AUDIT_ENV: str(out)}


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _assert_single_threaded(out: Path, at_least: int) -> list[dict[str, Any]]:
    events = _events(out)
    assert len(events) >= at_least, events  # the hook saw the launcher's forks and spawns
    violations = [e for e in events if e["python_threads"] != 1 or e["os_threads"] != 1]
    assert violations == []
    return events


def _launcher(args: Sequence[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "openclaw_launch", *args]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_stats_run_forks_and_spawns_single_threaded(tmp_path: Path) -> None:
    """Metrics endpoint, stats file, hang watch: the helper serves them while the workers start."""
    out, stats_file = tmp_path / "audit.jsonl", tmp_path / "stats.jsonl"
    args = ["--nproc-per-node", "2", "--metrics-port", "0", "--stats-file", str(stats_file)]
    args += ["--hang-timeout-s", "5", "--stats-interval-s", "1", "--report", str(tmp_path / "r.json")]
    proc = _launcher([*args, SECTIONS, "--steps", "60"], _audited_env(tmp_path, out), tmp_path)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err
    assert "metrics on http://0.0.0.0:" in err and stats_file.read_text().count("\n") >= 1
    events = _assert_single_threaded(out, at_least=4)  # guardian, cgroup probe or not, helper, 2 workers
    kinds = [e["event"] for e in events]
    assert kinds.count("subprocess.Popen") >= 2 and "os.fork" in kinds


def test_a_restart_spawns_single_threaded_with_the_helper_running(tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--restart-backoff-s", "0.1"]
    args += ["--metrics-port", "0", "--stats-file", str(tmp_path / "stats.jsonl"), "--hang-timeout-s", "5"]
    worker = [*FAKE, "--exit", "3", "--only-rank", "1", "--fail-below-attempt", "1"]
    proc = _launcher([*args, "--no-python", "--", *worker], _audited_env(tmp_path, out), tmp_path)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err
    assert "attempt 2/2" in err
    events = _assert_single_threaded(out, at_least=5)
    assert [e["event"] for e in events].count("subprocess.Popen") >= 4  # two attempts of two workers


def _two_nodes(tmp: Path, extra: Sequence[str], worker: Sequence[str]) -> dict[str, subprocess.Popen[str]]:
    master, agent = str(free_port()), str(free_port())
    procs = {}
    for node in ("node0", "node1"):
        cmd = ["--config", str(CONFIG), "--node", node, "--master-port", master, "--agent-port", agent]
        cmd += ["--run-id", "fork", "--keepalive-s", "2", "--grace-period-s", "2", *extra]
        cmd += ["--report", str(tmp / f"report-{node}.json"), "--no-python", "--", *FAKE, *worker]
        procs[node] = _launcher(cmd, _audited_env(tmp, tmp / f"audit-{node}.jsonl"), ROOT)
    return procs


@needs_torch  # the agents' store (in their helper)
@pytest.mark.usefixtures("served_agent_stores")
def test_two_nodes_with_agents_fork_and_spawn_single_threaded(tmp_path: Path) -> None:
    procs = _two_nodes(tmp_path, ["--metrics-port", "0"], ["--sleep", "0.5"])
    errs = {}
    for node, proc in procs.items():
        _, errs[node] = proc.communicate(timeout=GUARD_S)
        assert proc.returncode == 0, (node, errs[node])
    assert "job report (every node)" in errs["node0"]
    for node in procs:
        _assert_single_threaded(tmp_path / f"audit-{node}.jsonl", at_least=3)


def _helper(launcher: psutil.Process, name: str) -> psutil.Process:
    def named() -> psutil.Process | None:
        for child in launcher.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.name() == name:
                    return child
        return None

    return wait_for(named, f"no {name} helper under pid {launcher.pid}", poll_s=0.05)


def _wait_gone(proc: psutil.Process) -> None:
    def gone() -> bool:
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(gone, f"the helper {proc.pid} outlived its launcher")


def test_the_stats_helper_dies_with_a_sigkilled_launcher(tmp_path: Path) -> None:
    args = ["--nproc-per-node", "1", "--metrics-port", "0", "--no-python", "--", *FAKE, "--sleep", "600"]
    proc = _launcher(args, {**os.environ, "PYTHONPATH": str(ROOT)}, tmp_path)
    helper = _helper(psutil.Process(proc.pid), "openclaw-stats")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=GUARD_S)
    _wait_gone(helper)


@needs_torch  # the agents' store (in their helper)
@pytest.mark.usefixtures("served_agent_stores")
def test_the_agent_helper_dies_with_a_sigkilled_launcher(tmp_path: Path) -> None:
    procs = _two_nodes(
        tmp_path, ["--telemetry", "off"], ["--ready-file", f"{tmp_path}/ready-{{rank}}", "--sleep", "600"]
    )
    helper = _helper(psutil.Process(procs["node1"].pid), "openclaw-agent")

    def met() -> bool:  # the nodes met, the job runs
        assert all(p.poll() is None for p in procs.values()), "a launcher ended before the job ran"
        return all((tmp_path / f"ready-{r}").exists() for r in range(3))

    wait_for(met, "the nodes never met", poll_s=0.05)
    procs["node1"].send_signal(signal.SIGKILL)
    procs["node1"].communicate(timeout=GUARD_S)
    _wait_gone(helper)
    procs["node0"].communicate(timeout=GUARD_S)  # it sees node1 lost and stops
    assert procs["node0"].returncode == 1


def test_py_spy_dumps_start_on_the_calling_thread_and_a_silent_one_is_killed(tmp_path: Path) -> None:
    """The hang monitor's stack dumps (stats/hang_monitor.py): processes, no thread in the launcher.
    A stand-in py-spy: it prints the pid it was given, and never answers for pid 2."""
    import threading

    from openclaw_launch.stats.hang_monitor import PySpy

    exe = tmp_path / "py-spy"
    exe.write_text('#!/bin/sh\n[ "$3" = 2 ] && exec sleep 600\necho "Thread $3 (MainThread)"\necho oops >&2\n')
    exe.chmod(0o755)
    spy = PySpy(str(exe), timeout_s=0.5)
    threads = threading.active_count()
    for rank in (0, 1, 2):
        spy.start(rank, pid=rank)
    assert threading.active_count() == threads
    wait_for(spy.done, "the stack dumps never ended", poll_s=0.05)
    assert spy.take() == {
        0: "Thread 0 (MainThread)\n",
        1: "Thread 1 (MainThread)\n",
        2: "(py-spy failed: no answer within 0.5 s)",
    }


def _elastic_line(port: int) -> list[str]:
    line = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    return [*line, f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=0.2", "--max-restarts", "2"]


@needs_torch  # the agents' store (in their helper)
@pytest.mark.usefixtures("served_agent_stores")
def test_an_elastic_job_re_forming_forks_and_spawns_single_threaded(tmp_path: Path) -> None:
    """--nnodes 1:2: a world of one runs, a node arrives, the world re-forms (the rendezvous in the
    agents' helpers) and both launchers spawn the new world's workers."""
    line = _elastic_line(free_port())
    (tmp_path / "go-1").touch()  # attempt 0 waits until the re-forming stops it; attempt 1 ends at once
    worker = [*FAKE, "--ready-file", f"{tmp_path}/ready-{{attempt}}", "--wait-for", f"{tmp_path}/go-{{attempt}}"]
    first = _launcher([*line, "--no-python", "--", *worker], _audited_env(tmp_path, tmp_path / "a.jsonl"), ROOT)
    wait_for(lambda: (tmp_path / "ready-0").exists() or first.poll() is not None, "the world of one never ran")
    second = _launcher([*line, "--no-python", "--", *worker], _audited_env(tmp_path, tmp_path / "b.jsonl"), ROOT)
    errs = []
    for proc in (first, second):
        _, err = proc.communicate(timeout=GUARD_S)
        assert proc.returncode == 0, err
        errs.append(err)
    assert "a node joined" in errs[0]  # the world re-formed
    for name in ("a", "b"):
        _assert_single_threaded(tmp_path / f"{name}.jsonl", at_least=3)  # guardian, agent helper, a worker


@needs_torch  # the store the launchers take their node ranks from
@pytest.mark.usefixtures("served_agent_stores")
def test_node_ranks_by_arrival_fork_and_spawn_single_threaded(tmp_path: Path) -> None:
    """--nnodes 2 without a config (torchrun's c10d line): each launcher takes its node rank from the
    first node's store before it plans."""
    line = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint"]
    line += [f"127.0.0.1:{free_port()}", "--telemetry", "off", "--no-python", "--", *FAKE, "--sleep", "0.2"]
    procs = [_launcher(line, _audited_env(tmp_path, tmp_path / f"audit-{n}.jsonl"), ROOT) for n in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=GUARD_S)
        assert proc.returncode == 0, err
        assert "(by arrival at 127.0.0.1:" in err
    for n in range(2):
        _assert_single_threaded(tmp_path / f"audit-{n}.jsonl", at_least=3)


@needs_torch  # the probe's all-reduce (gloo)
def test_run_preflight_forks_and_spawns_single_threaded(tmp_path: Path) -> None:
    """`run --preflight`: the probe's workers, then the job's, from one launcher."""
    cfg = tmp_path / "box.yaml"
    cfg.write_text(
        "cluster:\n  nodes:\n    - {name: box, ip: 127.0.0.1, cpu_workers: 2}\n"
        "runtime: {binding: none, mem_policy: none}\n"
        "preflight:\n  expect_busbw_gbps: {node: 0.0001}\n  size_mib: 1\n  iters: 3\n"
    )
    out = tmp_path / "audit.jsonl"
    args = ["run", "--config", str(cfg), "--preflight", "--no-python", "--", *FAKE, "--sleep", "0.1"]
    proc = _launcher(args, _audited_env(tmp_path, out), tmp_path)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err
    events = _assert_single_threaded(out, at_least=4)
    assert [e["event"] for e in events].count("subprocess.Popen") >= 4  # two probe workers, two of the job


def test_the_mps_path_forks_and_spawns_single_threaded(tmp_path: Path) -> None:
    """The job's own MPS daemon (tests/fake_mps): started, its limits set, stopped, around GPU ranks
    whose workers never touch a GPU (the recorded H200 host)."""
    cfg = tmp_path / "mps.yaml"
    text = (ROOT / "configs" / "h200x2.yaml").read_text()
    cfg.write_text(text.replace("enable_mps: false", "enable_mps: true\n  mps_max_clients_per_gpu: 2", 1))
    out = tmp_path / "audit.jsonl"
    env = _audited_env(tmp_path, out)
    env["PATH"] = f"{ROOT / 'tests' / 'fake_mps'}{os.pathsep}{env['PATH']}"
    args = ["--config", str(cfg), "--topology", str(ROOT / "configs" / "h200x2.snapshot.json")]
    proc = _launcher([*args, "--no-python", "--", *FAKE, "--sleep", "0.1"], env, tmp_path)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, err
    events = _assert_single_threaded(out, at_least=5)
    assert any("nvidia-cuda-mps-control" in e["what"] for e in events)  # the daemon and its commands


INTRUDER = """
import _thread, ctypes, time

def _intruder():
    ctypes.CDLL(None).prctl(15, b"intruder", 0, 0, 0)  # PR_SET_NAME: the kernel's name of this thread
    time.sleep(600)

_thread.start_new_thread(_intruder, ())  # a thread that threading does not count, as a C library's
time.sleep(0.1)
"""


def test_a_thread_at_fork_is_an_internal_error_that_names_it_and_starts_nothing(tmp_path: Path) -> None:
    """The production check (openclaw_launch/single_thread.py): a thread the launcher does not know of
    (as one a C library starts) stops the first fork with an error that names it."""
    site = tmp_path / "intruder-site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INTRUDER)
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}
    ready = tmp_path / "ready"
    proc = _launcher(["--nproc-per-node", "1", "--no-python", "--", *FAKE, "--ready-file", str(ready)], env, tmp_path)
    _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 1, err
    assert "ThreadedForkError: internal error: openclaw-launch is about to fork" in err
    assert " intruder" in err  # the kernel's name of the thread
    assert not ready.exists()
