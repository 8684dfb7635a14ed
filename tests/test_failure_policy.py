"""Failure classes and the restart-storm rule with real launchers and real workers (run/failure_policy.py).

Each job is the real CLI on CPU ranks; the worker scripts fail in the way under test (an exception
before any step, after steps, an error file in torch's ``@record`` format, SIGKILL, NCCL's text).
NVML is the absent hardware: its XID event comes from a mocked provider (and, through the real
statistics helper, from a recorded source).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from guards import GUARD_S, wait_for
from host import free_port
from supervise_driver import make_plan

from openclaw_launch.exit_codes import REQUEUE, SCRIPT_FAILED
from openclaw_launch.run.failure_class import GpuEvent
from openclaw_launch.run.failure_policy import FailurePolicy
from openclaw_launch.run.participant import Participant
from openclaw_launch.run.supervise import SuperviseOptions, supervise
from openclaw_launch.stats.gpu import RecordedSource, SampleSource
from openclaw_launch.stats.session import StatsSession

GPU = "GPU-7a3b1c9d-ef01-2345-6789-0abcdef12345"


def launch(tmp: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The launcher on one CPU rank running ``script``; its result and report."""
    path = tmp / "train.py"
    path.write_text(script)
    report = tmp / "run.json"
    command = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "cpu", "--nproc_per_node", "1"]
    command += ["--restart-backoff-s", "0.05", "--report", str(report), *args, str(path)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=GUARD_S, cwd=tmp)
    return proc, json.loads(report.read_text())


def classes(report: dict[str, Any]) -> list[str | None]:
    return [(a["failure"] or {}).get("failure_class") for a in report["attempt_history"]]


def error_file_script(message: str, code: int = 1) -> str:
    """A worker that leaves torch's ``@record`` error file (and no traceback on stderr), then exits ``code``."""
    data = {"message": {"message": message, "extraInfo": {"py_callstack": "...", "timestamp": "0"}}}
    return (
        "import json, os, sys\n"
        f"open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write(json.dumps({data!r}))\n"
        f"sys.exit({code})\n"
    )


def test_the_same_exception_before_any_step_twice_stops_the_job_after_two_attempts(tmp_path: Path) -> None:
    proc, report = launch(tmp_path, "raise ValueError('no such dataset')\n", "--max-restarts", "5", "--storm-guard")
    assert proc.returncode == 1, proc.stderr  # the worker's code, as without the rule
    assert report["attempts"] == 2 and classes(report) == ["exception", "exception"]
    assert report["attempt_history"][1]["failure"]["storm"] is True
    storm = next(line for line in proc.stderr.splitlines() if "restart storm" in line)
    assert "rank 0" in storm and "exception: ValueError" in storm and "4 of --max-restarts 5 unused" in storm
    assert "attempt 2: failure class exception (ValueError), rank 0" in proc.stderr  # the exit summary


def test_a_failure_after_steps_keeps_restarting(tmp_path: Path) -> None:
    script = "from openclaw_launch import telemetry\nfor _ in range(4):\n    telemetry.step()\nraise ValueError('x')\n"
    proc, report = launch(tmp_path, script, "--max-restarts", "2")
    assert proc.returncode == 1 and report["attempts"] == 3, proc.stderr
    assert classes(report) == ["exception"] * 3 and "restart storm" not in proc.stderr


def test_the_exception_type_comes_from_the_error_file(tmp_path: Path) -> None:
    proc, report = launch(tmp_path, error_file_script("RuntimeError: checkpoint shard 3 is corrupt"))
    assert proc.returncode == 1, proc.stderr
    failure = report["attempt_history"][0]["failure"]
    assert (failure["failure_class"], failure["detail"], failure["restart_helps"]) == (
        "exception",
        "RuntimeError",
        False,
    )


def test_torchs_own_record_error_file_names_a_cuda_oom(tmp_path: Path) -> None:
    """torch's ``@record`` writes the error file (``OutOfMemoryError: ...``); raised by hand on a CPU rank."""
    script = (
        "import torch\nfrom torch.distributed.elastic.multiprocessing.errors import record\n\n\n@record\n"
        "def main():\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 80.00 GiB')\n\n\nmain()\n"
    )
    proc, report = launch(tmp_path, script)
    assert proc.returncode == 1, proc.stderr
    assert classes(report) == ["cuda-oom"] and report["attempt_history"][0]["failure"]["detail"] == "OutOfMemoryError"


def test_nccl_text_in_the_error_file_is_a_fabric_failure_and_requeues(tmp_path: Path) -> None:
    message = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, ncclSystemError"
    proc, report = launch(tmp_path, error_file_script(message), "--exit-code-classes")
    assert proc.returncode == REQUEUE, proc.stderr
    assert classes(report) == ["nccl"] and report["exit_code"] == REQUEUE


def test_a_sigkilled_worker_is_killed_and_a_script_failure_exits_70(tmp_path: Path) -> None:
    proc, report = launch(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert proc.returncode == 137 and classes(report) == ["killed"], proc.stderr
    assert report["attempt_history"][0]["failure"]["detail"] == "SIGKILL"
    proc, report = launch(tmp_path, "raise KeyError('lr')\n", "--exit-code-classes")
    assert proc.returncode == SCRIPT_FAILED and classes(report) == ["exception"], proc.stderr


class _XidWhenSpawned(Participant):
    """A mocked NVML provider: an XID 79 on the rank's GPU once its worker runs (as a GPU that fell
    off the bus would report it)."""

    def __init__(self) -> None:
        self.events: list[GpuEvent] = []

    def on_spawn(self, rank: int, pid: int) -> None:
        self.events.append(GpuEvent("xid", GPU, 79))


def test_an_nvml_xid_on_the_ranks_gpu_classifies_its_failure(tmp_path: Path) -> None:
    plan = make_plan(1, ["--exit", "3", "--sleep", "0.05"])
    plan = replace(plan, ranks=(replace(plan.ranks[0], gpu_uuid=GPU),))
    nvml = _XidWhenSpawned()
    policy = FailurePolicy({0: GPU}, 0, lambda text: None, gpu_events=lambda: nvml.events)
    options = SuperviseOptions(stdout=io.StringIO(), stderr=io.StringIO(), use_guardian=False)
    result = supervise(plan, options, participants=[nvml, policy])
    assert result.exit_code == 3
    failure = policy.failures[0]
    assert (failure.name, failure.detail, failure.restart_helps) == ("gpu-xid", f"NVML: XID 79 on {GPU}", True)


def test_recorded_nvml_events_reach_the_launcher_through_the_statistics_helper(tmp_path: Path) -> None:
    """The production path of those events: the helper's sampler polls the source, the session hands
    them to the policy."""

    def source(uuids: list[str]) -> SampleSource:
        return RecordedSource({GPU: [{"util_pct": 1.0}]}, [{"kind": "xid", "uuid": GPU, "code": 48}])

    plan = make_plan(1, ["--exit", "0"])
    plan = replace(plan, ranks=(replace(plan.ranks[0], gpu_uuid=GPU),))
    sock = f"@oc-test-{os.getpid()}-{time.monotonic_ns()}"  # abstract, as the launcher's: no file left
    session = StatsSession(cast(Any, plan), sock, 5.0, lambda text: None, gpu_source=source)
    try:
        wait_for(session.gpu_events, "no NVML event over the helper's link")
        assert session.gpu_events() == [GpuEvent("xid", GPU, 48)]
    finally:
        session.close()


@pytest.mark.usefixtures("served_agent_stores")
def test_a_storm_on_one_node_stops_every_node_after_two_attempts(tmp_path: Path) -> None:
    """Two loopback agents: rank 2 (node1) fails the same way at start twice; node1's storm is its
    end outcome, which vetoes the restart on node0 too, so both stop with 2 of 6 attempts."""
    config = Path(__file__).resolve().parent.parent / "configs" / "two-nodes-loopback.yaml"
    script = tmp_path / "train.py"
    script.write_text("import os, time\nif os.environ['RANK'] == '2':\n    raise OSError('no data')\ntime.sleep(60)\n")
    ports = [str(free_port()), str(free_port())]
    procs = {}
    for node in ("node0", "node1"):
        cmd = [sys.executable, "-m", "openclaw_launch", "--config", str(config), "--node", node]
        cmd += ["--master-port", ports[0], "--agent-port", ports[1], "--run-id", "storm", "--keepalive-s", "2"]
        cmd += ["--grace-period-s", "2", "--max-restarts", "5", "--restart-backoff-s", "0.05", "--storm-guard"]
        cmd += ["--report", str(tmp_path / f"{node}.json"), "--job-report", str(tmp_path / "job.json"), str(script)]
        procs[node] = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {node: (p.communicate(timeout=GUARD_S)[1], p.returncode) for node, p in procs.items()}
    assert [code for _, code in out.values()] == [1, 1], out
    assert "restart storm: rank 2 on node node1" in out["node1"][0]
    for node in ("node0", "node1"):
        assert json.loads((tmp_path / f"{node}.json").read_text())["attempts"] == 2
    job = json.loads((tmp_path / "job.json").read_text())
    assert [a["failure"]["failure_class"] for a in job["attempt_history"]] == ["exception", "exception"]
    assert job["attempt_history"][1]["failure"]["storm"] and job["attempt_history"][1]["failure"]["node"] == "node1"


def test_a_hang_is_classified_and_exits_75_with_exit_code_classes(tmp_path: Path) -> None:
    script = "import time\nfrom openclaw_launch import telemetry\ntelemetry.step()\ntelemetry.step()\ntime.sleep(60)\n"
    proc, report = launch(tmp_path, script, "--hang-timeout-s", "2", "--grace-period-s", "1", "--exit-code-classes")
    assert proc.returncode == REQUEUE and report["hang"] is not None, proc.stderr
    assert classes(report) == ["hang"] and report["attempt_history"][0]["failure"]["restart_helps"]
