"""torchft's replica groups as one command (``--replica-groups K``, issue 31): the real launcher on
CPU with gloo, torchft's lighthouse and torchft's DDP example in its replica-group shape
(tests/torchft_groups_worker.py). One group's rank is SIGKILLed mid-run: the other group keeps
stepping while the killed one restarts and steps again; a SIGKILLed launcher leaves nothing behind;
the plan shows each group's world; bad input is one line and exit 2 before anything starts.
Skipped where torchft is not installed (scripts/setup.sh --test installs it), but for the case that
says so."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from host import listening, needs_torch

from openclaw_launch.config.defaults import (
    LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS,
    LIGHTHOUSE_JOIN_TIMEOUT_MS,
    LIGHTHOUSE_QUORUM_TICK_MS,
    LIGHTHOUSE_START_TIMEOUT_MS,
)
from openclaw_launch.report.replica_groups import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/torchft_groups_worker.py"
LIGHTHOUSE = shutil.which("torchft_lighthouse", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
needs_torchft = pytest.mark.skipif(LIGHTHOUSE is None, reason="torchft is not installed (pip install torchft)")


def _launcher(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_launch", *args],
        cwd=ROOT,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )


def _step(marks: Path, group: int) -> tuple[int, int]:
    """Group ``group``'s last committed step and the attempt that made it ((0, -1): none yet)."""
    try:
        step, _, attempt = (marks / f"step-g{group}-r0").read_text().split()
    except (OSError, ValueError):
        return 0, -1
    return int(step), int(attempt)


def _stop_after(marks: Path, step: int) -> None:
    """Every group ends after ``step`` (tests/torchft_groups_worker.py reads D/stop)."""
    (marks / ".stop").write_text(str(step))
    (marks / ".stop").replace(marks / "stop")


def _steps(marks: Path, group: int) -> list[tuple[int, float, int]]:
    """Every committed step of the group: (step, the worker's monotonic time, attempt)."""
    lines = (marks / f"steps-g{group}-r0.log").read_text().splitlines()
    return [(int(s), float(t), int(a)) for s, t, a in (line.split() for line in lines if line.count(" ") == 2)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.parametrize("lighthouse", ["openclaw", "torchft"])
@needs_torch
@needs_torchft
def test_a_killed_group_restarts_while_the_other_keeps_stepping(tmp_path: Path, lighthouse: str) -> None:
    """Under either lighthouse (openclaw's is told the group is gone; torchft's waits for its
    heartbeat to expire) the other group steps on while the killed one restarts and heals."""
    marks, report = tmp_path / "marks", tmp_path / "report.json"
    marks.mkdir()
    line = ["--nproc-per-node", "2", "--replica-groups", "2", "--max-restarts", "1", "--report", str(report)]
    line += ["--lighthouse", lighthouse]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", *line, WORKER, "--mark-dir", str(marks)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,  # torchft's Rust INFO lines, every step
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _step(marks, 0)[0] >= 3 and _step(marks, 1)[0] >= 3, "both groups to step")
        killed_at = time.monotonic()  # the workers' clock too (CLOCK_MONOTONIC)
        os.kill(int((marks / "pid-g1-r0-a0").read_text()), signal.SIGKILL)
        at_kill = _step(marks, 0)[0]
        back = wait_for(lambda: _step(marks, 1) if _step(marks, 1)[1] == 1 else None, "group 1 to step again")
        _stop_after(marks, back[0] + 3)
        _, stderr = launcher.communicate(timeout=GUARD_S)
    finally:
        launcher.kill()
        launcher.communicate()
    assert launcher.returncode == 0, stderr[-4000:]
    first_back_s = next(t for _, t, attempt in _steps(marks, 1) if attempt == 1)
    meanwhile = [step for step, t, _ in _steps(marks, 0) if killed_at < t < first_back_s]
    assert meanwhile, "group 0 made no step between the kill and group 1's first step after its restart"
    assert back[0] > at_kill  # the restarted group healed to the others' step (torchft's recovery), not from 0
    assert "replica group 0: exit 0, 1 attempt(s)" in stderr
    assert "replica group 1: exit 0, 2 attempt(s) (1 restart(s))" in stderr and "stepping again" in stderr
    written = json.loads(report.read_text())
    assert (written["schema"], written["lighthouse_kind"]) == (SCHEMA, lighthouse)
    groups = written["groups"]
    assert [g["attempts"] for g in groups] == [1, 2]
    assert len(groups[1]["progress"]["rejoin_s"]) == 1 and groups[1]["progress"]["rejoin_s"][0] > 0
    assert all(Path(g["report"]).exists() for g in groups)  # each group's own node report, report-gG.json
    pids = [int(p.read_text()) for p in marks.glob("pid-*")]
    assert not [p for p in pids if _alive(p)]
    assert not listening(int((marks / "lighthouse").read_text().rsplit(":", 1)[1]))  # the lighthouse is gone


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@needs_torch
@needs_torchft
def test_nothing_outlives_the_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGKILL to the launcher of the groups: its group launchers die with it (their guardians end
    the workers), and so does the lighthouse. SIGTERM: it stops every group, then the lighthouse,
    and exits 143."""
    marks = tmp_path / "marks"
    marks.mkdir()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", "--replica-groups", "2"]
        + [WORKER, "--mark-dir", str(marks)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = [marks / "pid-g0-r0-a0", marks / "pid-g1-r0-a0", marks / "lighthouse"]
        wait_for(lambda: all(p.exists() for p in started), "both groups' workers to start")
        port = int((marks / "lighthouse").read_text().rsplit(":", 1)[1])
        wait_for(lambda: listening(port), "the lighthouse to listen")
        launcher.send_signal(sig)
        _, stderr = launcher.communicate(timeout=GUARD_S)
        pids = [int(p.read_text()) for p in marks.glob("pid-*")]
        wait_for(lambda: not [p for p in pids if _alive(p)], lambda: f"the workers {pids} to be gone")
        wait_for(lambda: not listening(port), "the lighthouse to be gone")
    finally:
        launcher.kill()
        launcher.communicate()
    assert launcher.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 143), stderr[-4000:]
    if sig == signal.SIGTERM:
        assert "received SIGTERM: stopping 2 replica group(s)" in stderr
        assert "replica group 1: exit 143" in stderr


@needs_torch
@needs_torchft
def test_a_group_that_fails_for_good_leaves_the_others_and_names_the_exit_code(tmp_path: Path) -> None:
    """Group 1 fails with no restart left: group 0 trains on alone to its end (its quorum shrinks),
    and the job then exits with group 1's code."""
    line = ["--nproc-per-node", "2", "--replica-groups", "2", WORKER, "--mark-dir", str(tmp_path)]
    proc = _launcher(*line, "--steps", "10", "--fail-group", "1")
    assert proc.returncode == 3, proc.stderr[-4000:]
    assert "replica group 1 ended with exit code 3" in proc.stderr
    assert "replica group 0: exit 0, 1 attempt(s)" in proc.stderr
    assert "replica group 1: exit 3, 1 attempt(s)" in proc.stderr
    assert "[group 0] [rank 0] torchft group 0 steps 10" in proc.stdout


@needs_torchft
def test_the_plan_shows_each_groups_world(tmp_path: Path) -> None:
    line = ["plan", "--json", "--nproc-per-node", "4", "--replica-groups", "2", "--master-port", "29700", WORKER]
    proc = _launcher(*line, env={**os.environ, "TORCHFT_MANAGER_PORT": "29512"})  # torchft's README line's
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    envs = [r["env"] for r in doc["ranks"]]
    assert [r["replica_group"] for r in doc["ranks"]] == [0, 0, 1, 1]
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["MASTER_PORT"]) for e in envs] == [
        ("0", "0", "2", "29700"),
        ("1", "1", "2", "29700"),
        ("0", "0", "2", "29701"),
        ("1", "1", "2", "29701"),
    ]
    assert [(e["REPLICA_GROUP_ID"], e["NUM_REPLICA_GROUPS"]) for e in envs] == [("0", "2")] * 2 + [("1", "2")] * 2
    assert [e["TORCHFT_MANAGER_PORT"] for e in envs] == ["29512", "29512", "29513", "29513"]  # rank 0 binds it
    lighthouse = doc["replica_groups"]["lighthouse"]
    assert {e["TORCHFT_LIGHTHOUSE"] for e in envs} == {lighthouse["address"]} == {"http://127.0.0.1:<free-port>"}
    assert lighthouse["kind"] == "openclaw"  # grpcio is installed: openclaw's, with torchft_lighthouse's options
    assert lighthouse["argv"][1:3] == ["-m", "openclaw_launch.run.lighthouse_server"]
    torchft = json.loads(_launcher(*line[:2], "--lighthouse", "torchft", *line[2:]).stdout)["replica_groups"]
    assert Path(torchft["lighthouse"]["argv"][0]).name == "torchft_lighthouse"
    start = ["--expected_replicas", "2", "--start_timeout_ms", str(LIGHTHOUSE_START_TIMEOUT_MS)]  # openclaw's only
    assert torchft["lighthouse"]["argv"][1:] + start == lighthouse["argv"][3:]
    config = tmp_path / "c.yaml"  # runtime.lighthouse chooses it too; the option wins
    config.write_text(
        "cluster:\n  nodes:\n    - {name: localhost, ip: 127.0.0.1, cpu_workers: 2}\n"
        "runtime:\n  master_addr: 127.0.0.1\n  replica_groups: 2\n  lighthouse: torchft\n"
    )
    by_config = [
        _launcher("plan", "--config", str(config), *more, WORKER).stdout for more in ([], ["--lighthouse", "openclaw"])
    ]
    assert [text.split("'s lighthouse")[0] for text in by_config] == [
        "replica groups 2 (torchft): torchft",
        "replica groups 2 (torchft): openclaw",
    ]
    settings = dict(zip(lighthouse["argv"][3::2], lighthouse["argv"][4::2], strict=True))
    assert (settings["--heartbeat_timeout_ms"], settings["--join_timeout_ms"], settings["--quorum_tick_ms"]) == (
        str(LIGHTHOUSE_HEARTBEAT_TIMEOUT_MS),  # a killed group is gone after this (torchft's default 5 s)
        str(LIGHTHOUSE_JOIN_TIMEOUT_MS),
        str(LIGHTHOUSE_QUORUM_TICK_MS),
    )
    assert len({e["TORCHELASTIC_ERROR_FILE"] for e in envs}) == 4  # each group's own files
    text = _launcher(*(a for a in line if a != "--json"))
    assert "replica group 1:" in text.stdout and "master 127.0.0.1:29701" in text.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--replica-groups", "3"], "3 does not divide the node's 4 ranks; give one of 1, 2, 4"),
        (["--replica-groups", "0"], "0: give at least 1 replica group"),
        (
            ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1", "--replica-groups", "2"],
            "not with an elastic job (--nnodes MIN:MAX)",
        ),
    ],
)
@needs_torchft
def test_bad_replica_groups_start_nothing(tmp_path: Path, args: list[str], said: str) -> None:
    proc = _launcher("--nproc-per-node", "4", *args, WORKER, "--mark-dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "--replica-groups" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not list(tmp_path.iterdir())  # no worker started


def test_without_torchft_replica_groups_are_one_line(tmp_path: Path) -> None:
    """The workers' Python where no torchft is installed (a directory with only its interpreter, and a
    PATH without the lighthouse): exit 2, naming the package."""
    (tmp_path / "python3").symlink_to(sys.executable)
    env = {**os.environ, "PYTHON_EXEC": str(tmp_path / "python3"), "PATH": str(tmp_path)}
    proc = _launcher("--nproc-per-node", "2", "--replica-groups", "2", WORKER, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "needs torchft" in proc.stderr and "pip install" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


_WITHOUT_GRPC = """import sys
sys.modules["grpc"] = None  # grpcio not importable: openclaw's lighthouse cannot run
from openclaw_launch.__main__ import main
sys.argv[0] = "openclaw-launch"
main()
"""


@needs_torchft
def test_without_grpcio_the_lighthouse_is_torchfts_and_openclaws_is_one_line(tmp_path: Path) -> None:
    """Where grpcio is not importable the default lighthouse is torchft's (the plan says so), and
    ``--lighthouse openclaw`` exits 2 with one line naming the option and what to install, before any
    worker starts."""
    (tmp_path / "launcher.py").write_text(_WITHOUT_GRPC)
    line = [sys.executable, str(tmp_path / "launcher.py")]
    groups = ["--nproc-per-node", "2", "--replica-groups", "2"]
    worker = [WORKER, "--mark-dir", str(tmp_path)]
    plan = subprocess.run([*line, "plan", *groups, *worker], cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S)
    assert plan.stdout.startswith("replica groups 2 (torchft): torchft's lighthouse"), plan.stderr
    proc = subprocess.run(
        [*line, *groups, "--lighthouse", "openclaw", *worker], cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S
    )
    assert proc.returncode == 2, proc.stderr
    assert "--lighthouse" in proc.stderr and "needs grpcio" in proc.stderr and "pip install" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["launcher.py"]  # no worker started


def test_each_gpu_group_sees_only_its_gpus() -> None:
    """The pure cut on a recorded 4-GPU shape (no torchft needed): group 1's ranks see GPUs 2 and 3 only,
    each its own by index, as torchft's README gives each group's torchrun ``CUDA_VISIBLE_DEVICES``;
    each group has its own statistics socket, slots numbered within it."""
    from test_plan import config, dgx, node_from, plan_for, uuid

    from openclaw_launch.plan.context import run_context
    from openclaw_launch.plan.replica_groups import plan_replica_groups

    topo = dgx(n=4)
    plan = plan_for(config(node_from(topo)), topo, telemetry_mode="hooks")
    contexts = [run_context(f"r-g{g}", "/tmp", None) for g in range(2)]
    groups = plan_replica_groups(
        plan, 2, contexts, [29600, 29601], ("torchft", ("/env/bin/torchft_lighthouse",)), 29510
    )
    first, second = groups.groups
    assert [r.gpu_uuid for r in second.ranks] == [uuid(2), uuid(3)]
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in second.ranks] == [f"{uuid(2)},{uuid(3)}"] * 2
    assert [r.env["OPENCLAW_CUDA_DEVICE_INDEX"] for r in second.ranks] == ["0", "1"]
    assert [(r.env["RANK"], r.env["LOCAL_RANK"], r.env["MASTER_PORT"]) for r in second.ranks] == [
        ("0", "0", "29601"),
        ("1", "1", "29601"),
    ]
    assert {r.env["TORCHFT_LIGHTHOUSE"] for p in groups.groups for r in p.ranks} == {"http://10.0.0.1:29510"}
    assert groups.lighthouse.argv[-2:] == ("--bind", "0.0.0.0:29510")
    assert first.telemetry_socket != second.telemetry_socket
    assert [r.env["OPENCLAW_TELEMETRY_SLOT"] for r in second.ranks] == ["0", "1"]


_SIGNAL_AT_FORK = """import os, signal, sys

def _at_fork():  # in group 0's launcher, right after its fork: before it has handlers of its own
    caller = sys._getframe(1)
    if caller.f_code.co_name == "_fork_group" and caller.f_locals["index"] == 0:
        os.kill(os.getpid(), signal.SIGTERM)

os.register_at_fork(after_in_child=_at_fork)
from openclaw_launch.__main__ import main
sys.argv[0] = "openclaw-launch"
main()
"""


def _run_wrapped(tmp_path: Path, launcher_script: str, *options: str) -> subprocess.CompletedProcess[str]:
    """Two replica groups of one empty worker each, under ``launcher_script`` (the launcher's own
    entry point behind a hook that sends a signal at the moment a test is about)."""
    (tmp_path / "launcher.py").write_text(launcher_script)
    (tmp_path / "worker.py").write_text("")
    line = ["--nproc-per-node", "2", "--replica-groups", "2", *options, str(tmp_path / "worker.py")]
    return subprocess.run(
        [sys.executable, str(tmp_path / "launcher.py"), *line],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )


@needs_torchft
def test_a_signal_to_a_group_launcher_before_its_handlers_ends_that_group_alone(tmp_path: Path) -> None:
    """A SIGTERM that reaches group 0's launcher between its fork and its own handlers (an at-fork hook
    sends it there) ends group 0 (143): it never runs the parent's handler, which would have written
    it to the parent's wakeup pipe as the parent's own SIGTERM and stopped every group."""
    proc = _run_wrapped(tmp_path, _SIGNAL_AT_FORK)
    assert "received SIGTERM" not in proc.stderr, proc.stderr
    assert "replica group 0: exit 143" in proc.stderr and "replica group 1: exit 0" in proc.stderr, proc.stderr
    assert proc.returncode == 143


_SIGNAL_AT_LIGHTHOUSE_STOP = """import os, signal, sys
from openclaw_launch.job.lighthouse import Lighthouse

_stop = Lighthouse.stop

def _stop_with_a_signal(self):  # the first stop: after the last group ended, before the summary
    if self.ended is None:
        os.kill(os.getpid(), signal.SIGTERM)
    _stop(self)

Lighthouse.stop = _stop_with_a_signal
from openclaw_launch.__main__ import main
sys.argv[0] = "openclaw-launch"
main()
"""


@needs_torchft
def test_a_signal_while_the_lighthouse_stops_is_the_exit_code(tmp_path: Path) -> None:
    """A SIGTERM that arrives after the last group ended, while the lighthouse is stopped, counts as
    one received during the job (as a single launcher's late signal does): 143, said, in the report."""
    report = tmp_path / "report.json"
    proc = _run_wrapped(tmp_path, _SIGNAL_AT_LIGHTHOUSE_STOP, "--report", str(report))
    assert "received SIGTERM after the last replica group ended" in proc.stderr, proc.stderr
    assert proc.returncode == 143, proc.stderr
    assert json.loads(report.read_text())["signal_received"] == "SIGTERM"
