"""Several agents, one job, on loopback: each `openclaw-launch --node NAME` of a two-node config
(node0: ranks 0-1, node1: rank 2), as two hosts would run them. Workers are tests/fake_worker.py
(no torch in them, so these stay quick); tests/test_multinode_loopback.py runs gloo workers."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from host import free_port, needs_torch
from test_supervise_run import recorded_pids, wait_gone

from openclaw_launch.report.build import load_report
from openclaw_launch.report.model import JobReport, NodeReport

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "two-nodes-loopback.yaml"
FAKE = [sys.executable, str(ROOT / "tests" / "fake_worker.py")]
pytestmark = [needs_torch, pytest.mark.usefixtures("served_agent_stores")]  # the agents meet through torch's TCPStore


def start(
    tmp: Path,
    worker: Sequence[str],
    extra: Sequence[str] = (),
    env: dict[str, dict[str, str]] | None = None,
    config: dict[str, Path] | None = None,
) -> dict[str, subprocess.Popen[str]]:
    master, agent = str(free_port()), str(free_port())
    procs = {}
    for node in ("node0", "node1"):
        cmd = [sys.executable, "-m", "openclaw_launch", "--config", str((config or {}).get(node, CONFIG))]
        cmd += ["--node", node, "--master-port", master, "--agent-port", agent, "--run-id", "agents"]
        cmd += ["--keepalive-s", "2", "--grace-period-s", "2", "--telemetry", "off"]
        cmd += ["--report", str(tmp / f"report-{node}.json"), *extra, "--no-python", "--", *FAKE, *worker]
        node_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {}).get(node, {})}
        procs[node] = subprocess.Popen(
            cmd, cwd=ROOT, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return procs


def finish(procs: dict[str, subprocess.Popen[str]]) -> dict[str, tuple[int, str]]:
    out = {}
    for node, p in procs.items():
        stdout, stderr = p.communicate(timeout=GUARD_S)
        out[node] = (p.returncode, stdout + stderr)
    return out


def wait_files(paths: Sequence[Path], procs: dict[str, subprocess.Popen[str]]) -> None:
    def written() -> bool:
        assert all(p.poll() is None for p in procs.values()), finish(procs)
        return all(p.exists() for p in paths)

    wait_for(written, lambda: f"never appeared: {[str(p) for p in paths if not p.exists()]}", poll_s=0.05)


def test_agents_agree_and_the_first_node_writes_one_report_for_the_job(tmp_path: Path) -> None:
    procs = start(tmp_path, ["--ready-file", f"{tmp_path}/ready-{{rank}}"])
    results = finish(procs)
    assert [code for code, _ in results.values()] == [0, 0], results
    assert "job report (every node):" in results["node0"][1] and "job report" not in results["node1"][1]
    job = json.loads((tmp_path / "report-node0-job.json").read_text())
    assert job["scope"] == "job" and [n["node"] for n in job["nodes"]] == ["node0", "node1"]
    assert [(r["rank"], r["node"]) for r in job["ranks"]] == [(0, "node0"), (1, "node0"), (2, "node1")]
    assert {f.name for f in dataclasses.fields(NodeReport)} <= set(job)  # every key a node's report has
    assert set(job["containment"]) == {"node0", "node1"} and job["console_dropped_lines"] == 0
    [attempt] = job["attempt_history"]
    assert [(r["rank"], r["node"]) for r in attempt["ranks"]] == [(0, "node0"), (1, "node0"), (2, "node1")]
    assert isinstance(load_report(tmp_path / "report-node0-job.json"), JobReport)  # `report` reads it
    assert len(json.loads((tmp_path / "report-node1.json").read_text())["ranks"]) == 1  # each its own too
    assert not (tmp_path / "report-node1-job.json").exists()


def _nccl_wheel(where: Path, version: str) -> str:
    """A real distribution's metadata, as the nvidia-nccl-cu12 wheel installs it: what node1's
    PYTHONPATH adds (read by importlib.metadata; nothing in it is imported)."""
    info = where / f"nvidia_nccl_cu12-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: {version}\n")
    return f"{ROOT}{os.pathsep}{where}"


@pytest.mark.parametrize("what", ["nccl-variable", "inherited-cuda-variable", "config-value", "nccl-version"])
def test_a_mismatch_stops_every_node_before_start_with_the_difference(tmp_path: Path, what: str) -> None:
    env, config = {}, {}
    if what == "nccl-variable":
        env = {"node1": {"NCCL_ALGO": "Ring"}}
        says = "node node1: env.NCCL_ALGO = 'Ring', node node0 has <unset>"
    elif what == "inherited-cuda-variable":  # not in the plan: the workers inherit it from node1's launcher
        env = {"node1": {"CUDA_LAUNCH_BLOCKING": "1"}}
        says = "node node1: env.CUDA_LAUNCH_BLOCKING = '1', node node0 has <unset>"
    elif what == "nccl-version":
        env = {"node1": {"PYTHONPATH": _nccl_wheel(tmp_path / "site", "2.27.3")}}
        says = "node node1: version.nccl = '2.27.3', node node0 has <unset>"
    else:
        changed = tmp_path / "changed.yaml"
        changed.write_text(CONFIG.read_text().replace("binding: none", "binding: none\n  nccl_nthreads: 8"))
        config = {"node1": changed}
        says = "node node1: config.runtime.nccl_nthreads = '8', node node0 has 'null'"
    procs = start(tmp_path, ["--ready-file", f"{tmp_path}/ready-{{rank}}"], env=env, config=config)
    results = finish(procs)
    for code, text in results.values():
        assert code == 2, text
        assert "the nodes do not agree; started nothing on any node" in text and says in text
    assert not list(tmp_path.glob("ready-*"))


def test_a_difference_on_the_warn_list_is_printed_on_every_node_and_the_job_runs(tmp_path: Path) -> None:
    env = {"node0": {"OMP_NUM_THREADS": "2"}, "node1": {"OMP_NUM_THREADS": "3", "TORCH_SHOW_CPP_STACKTRACES": "1"}}
    results = finish(start(tmp_path, ["--ready-file", f"{tmp_path}/ready-{{rank}}"], env=env))
    for code, text in results.values():
        assert code == 0, text
        assert "the nodes differ where that only warns (docs/multinode.md):" in text
        assert "node node1: env.OMP_NUM_THREADS = '3', node node0 has '2'" in text
        assert "node node1: env.TORCH_SHOW_CPP_STACKTRACES = '1', node node0 has <unset>" in text
    assert len(list(tmp_path.glob("ready-*"))) == 3


def test_a_failure_on_node1_stops_node0_within_5_s(tmp_path: Path) -> None:
    ready = [tmp_path / f"ready-{r}" for r in range(3)]
    worker = ["--ready-file", f"{tmp_path}/ready-{{rank}}", "--pids-file", f"{tmp_path}/pids-{{rank}}"]
    worker += ["--wait-for", str(ready[1]), "--only-rank", "2", "--exit", "3", "--sleep", "120"]
    procs = start(tmp_path, worker)
    wait_files(ready, procs)
    failed_at = time.monotonic()  # rank 2 exits as soon as rank 1 is ready
    procs["node0"].wait(timeout=GUARD_S)
    took = time.monotonic() - failed_at
    results = finish(procs)
    assert took < 5, f"node0 stopped {took:.1f} s after node1's failure"
    assert [code for code, _ in results.values()] == [3, 3], results  # one exit code, every node
    assert "node node1: root cause: rank 2 (local rank 0) on node node1" in results["node0"][1]
    assert "stopping this node's (node0) workers" in results["node0"][1]
    job = json.loads((tmp_path / "report-node0-job.json").read_text())
    assert job["exit_code"] == 3 and job["root_cause"]["rank"] == 2 and job["root_cause"]["node"] == "node1"
    wait_gone(recorded_pids(tmp_path))


def test_restarts_happen_on_every_node_in_lockstep(tmp_path: Path) -> None:
    worker = ["--ready-file", f"{tmp_path}/ready-{{rank}}-{{attempt}}", "--wait-for", f"{tmp_path}/ready-1-0"]
    worker += ["--only-rank", "2", "--fail-below-attempt", "1", "--exit", "3", "--sleep", "2"]
    procs = start(tmp_path, worker, extra=["--max-restarts", "2", "--restart-backoff-s", "0.1"])
    results = finish(procs)
    assert [code for code, _ in results.values()] == [0, 0], results
    for node in ("node0", "node1"):
        assert json.loads((tmp_path / f"report-{node}.json").read_text())["attempts"] == 2
    assert sorted(p.name for p in tmp_path.glob("ready-*")) == [f"ready-{r}-{a}" for r in range(3) for a in (0, 1)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_node1s_launcher_signalled_or_killed_stops_node0(tmp_path: Path, sig: int) -> None:
    ready = [tmp_path / f"ready-{r}" for r in range(3)]
    worker = ["--ready-file", f"{tmp_path}/ready-{{rank}}", "--pids-file", f"{tmp_path}/pids-{{rank}}"]
    procs = start(tmp_path, [*worker, "--sleep", "120"])
    wait_files(ready, procs)
    sent = time.monotonic()
    procs["node1"].send_signal(sig)
    procs["node0"].wait(timeout=GUARD_S)
    took = time.monotonic() - sent
    results = finish(procs)
    if sig == signal.SIGTERM:  # a signal to one agent: every node stops, 128+signal everywhere
        assert [code for code, _ in results.values()] == [143, 143], results
        assert "node node1: its launcher received SIGTERM" in results["node0"][1]
        assert took < 5
    else:  # lost: noticed within the keep-alive (2 s here)
        assert results["node0"][0] == 1, results
        assert "node node1 is lost (no keep-alive for" in results["node0"][1]
        assert took < 2 + 4
    wait_gone(recorded_pids(tmp_path))


def test_a_node_that_never_arrives_is_named_and_nothing_starts(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "openclaw_launch", "--config", str(CONFIG), "--node", "node0"]
    cmd += ["--master-port", str(free_port()), "--agent-port", str(free_port()), "--agent-timeout-s", "2"]
    cmd += ["--no-python", "--", *FAKE, "--ready-file", f"{tmp_path}/ready-{{rank}}"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S)
    assert out.returncode == 2, out.stderr
    assert "node(s) node1 never arrived: waited 2 s at 127.0.0.1:" in out.stderr and "started nothing" in out.stderr
    assert not list(tmp_path.glob("ready-*"))


def test_job_report_names_the_straggler_by_node_and_rank(tmp_path: Path) -> None:
    """gloo workers stepping with the telemetry API, rank 2 (node1) slow in its input: node0's job
    report judges all three ranks and names node1's rank 2; node0's own report cannot see it."""
    master, agent = str(free_port()), str(free_port())
    script = str(ROOT / "tests" / "telemetry_workers" / "sections.py")
    procs = {}
    for node in ("node0", "node1"):
        cmd = [sys.executable, "-m", "openclaw_launch", "--config", str(CONFIG), "--node", node]
        cmd += ["--master-port", master, "--agent-port", agent, "--run-id", "stats", "--console-ranks", "none"]
        cmd += ["--report", str(tmp_path / f"report-{node}.json"), script]
        cmd += ["--slow-rank", "2", "--slow-phase", "input", "--slow-ms", "12"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs[node] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    results = finish(procs)
    assert [code for code, _ in results.values()] == [0, 0], results
    job = json.loads((tmp_path / "report-node0-job.json").read_text())
    [s] = job["stragglers"]
    assert (s["node"], s["rank"], s["phase"]) == ("node1", 2, "input")
    assert all(r["statistics"]["steps"] > 0 for r in job["ranks"])
    assert "straggler: rank 2 on node node1" in results["node0"][1]


# ---- a hang is the job's fate (issue 16) -------------------------------------------------------

STEPPER = str(ROOT / "tests" / "telemetry_workers" / "stepper.py")  # steps alone: no collective, no torch
HANG_TIMEOUT_S = 3.0


def start_steppers(tmp: Path, worker: Sequence[str]) -> dict[str, subprocess.Popen[str]]:
    """Both nodes with the hang watch on and one restart allowed, the workers stepping on their own
    (a hung rank on node1 does not hold node0's ranks back: only the agents can stop them)."""
    master, agent = str(free_port()), str(free_port())
    procs = {}
    for node in ("node0", "node1"):
        cmd = [sys.executable, "-m", "openclaw_launch", "--config", str(CONFIG), "--node", node]
        cmd += ["--master-port", master, "--agent-port", agent, "--run-id", "hang", "--keepalive-s", "2"]
        cmd += ["--grace-period-s", "2", "--hang-timeout-s", str(HANG_TIMEOUT_S), "--max-restarts", "1"]
        cmd += ["--restart-backoff-s", "0.1", "--report", str(tmp / f"report-{node}.json"), STEPPER, *worker]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        procs[node] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    return procs


def assert_one_hang_fate(tmp: Path, procs: dict[str, subprocess.Popen[str]], hung: Path) -> dict[str, tuple[int, str]]:
    wait_files([hung], procs)
    hung_at = time.monotonic()
    for p in procs.values():
        p.wait(timeout=GUARD_S)
    took = time.monotonic() - hung_at
    results = finish(procs)
    assert [code for code, _ in results.values()] == [124, 124], results  # one fate, every node
    assert took < HANG_TIMEOUT_S + 8, f"both nodes stopped {took:.1f} s after the hang"
    assert "node node1: hang: no step for 3 s; stuck: rank 2" in results["node0"][1]
    for node in ("node0", "node1"):
        report = json.loads((tmp / f"report-{node}.json").read_text())
        assert report["exit_code"] == 124 and report["attempts"] == 1, node
    job = json.loads((tmp / "report-node0-job.json").read_text())
    assert job["exit_code"] == 124 and job["attempts"] == 1
    assert [(r["rank"], r["node"]) for r in job["hang"]["ranks"] if r["stuck"]] == [(2, "node1")]
    return results


def test_a_hang_on_node1_alone_stops_both_nodes_with_124_and_no_restart(tmp_path: Path) -> None:
    hung = tmp_path / "hung"
    procs = start_steppers(tmp_path, ["--hang-rank", "2", "--hang-at", "10", "--hung-file", str(hung)])
    results = assert_one_hang_fate(tmp_path, procs, hung)
    assert "attempt 2/" not in results["node0"][1] + results["node1"][1]


def test_a_hang_on_node1_then_a_failure_on_node0_is_still_the_hang(tmp_path: Path) -> None:
    """Issue 16's case: rank 2 (node1) stops stepping, 12 s later rank 0 (node0) would exit 7. The
    hang is the job's fate first: node0 is stopped before its rank fails; nobody restarts."""
    hung = tmp_path / "hung"
    worker = ["--hang-rank", "2", "--hang-at", "10", "--hung-file", str(hung)]
    worker += ["--exit-rank", "0", "--exit-code", "7", "--exit-after-hung-s", "12"]
    results = assert_one_hang_fate(tmp_path, start_steppers(tmp_path, worker), hung)
    assert "EXITING rank 0" not in results["node0"][1]
