"""The MPS daemon's lifecycle with real processes, against the stand-in control program."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath

import psutil
import pytest
from guards import GUARD_S, wait_for
from supervise_driver import rank_plan

from openclaw_launch.errors import LaunchError, PlanError
from openclaw_launch.plan.context import RunDir, run_context
from openclaw_launch.plan.env import mps_client_env
from openclaw_launch.plan.model import LaunchPlan, MpsPlan, RankPlan
from openclaw_launch.run.mps.commands import check_client_limit, clients_per_gpu
from openclaw_launch.run.mps.control import find_mps_processes, run_control
from openclaw_launch.run.mps.daemon import MpsDaemon, start_mps
from openclaw_launch.run.mps.status import mps_status, parse_device_clients

FAKE_DIR = Path(__file__).parent / "fake_mps"
FAKE = str(FAKE_DIR / "nvidia-cuda-mps-control")
GPU_A = "GPU-7a3b1c9d-ef01-2345-6789-0abcdef12345"
GPU_B = "GPU-8b4c2d0e-f012-3456-789a-bcdef0123456"


def mps_plan(**kw: object) -> MpsPlan:
    fields: dict[str, object] = {
        "max_clients_per_gpu": None,
        "active_thread_percentage": None,
        "pinned_device_mem_limit": None,
        "on_start_failure": "error",
        "gpu_uuids": (GPU_A, GPU_B),
    }
    fields.update(kw)
    return MpsPlan(**fields)  # type: ignore[arg-type]


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def _zombie_children() -> set[int]:
    return {c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE}


_EARLIER_ZOMBIES: set[int] = set()


@pytest.fixture(autouse=True)
def _earlier_zombies() -> None:
    """A child an earlier test of this pytest worker left unreaped is not this test's: only the
    zombies that appear during a test count (seen once in CI: every later test here failed on one)."""
    _EARLIER_ZOMBIES.clear()
    _EARLIER_ZOMBIES.update(_zombie_children())


def assert_nothing_left(pipe_dir: Path) -> None:
    assert find_mps_processes(pipe_dir) == []
    assert _zombie_children() - _EARLIER_ZOMBIES == set()


def wait_until_no_mps(pipe_dir: Path) -> None:
    wait_for(lambda: not find_mps_processes(pipe_dir), f"an MPS daemon still serves {pipe_dir}", poll_s=0.05)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "mps"


def test_start_answers_private_dirs_stop_leaves_nothing(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_DIR}{os.pathsep}{os.environ['PATH']}")  # found by name on PATH
    daemon = MpsDaemon(mps_plan(), run_dir)
    daemon.start()
    planned = RunDir(path=PurePosixPath(run_dir.parent), errors_dir=PurePosixPath(run_dir.parent), socket="@t")
    assert planned.mps_dir == PurePosixPath(run_dir)  # the launcher starts it in the plan's MPS directory:
    assert (daemon.pipe_dir, daemon.log_dir) == (Path(planned.mps_pipe_dir), Path(planned.mps_log_dir))  # served
    assert mps_client_env(daemon.pipe_dir, daemon.log_dir) == {
        "CUDA_MPS_PIPE_DIRECTORY": str(run_dir / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(run_dir / "log"),
    }
    for d in (run_dir, run_dir / "pipe", run_dir / "log"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert mps_status(run_dir / "pipe", FAKE).answering
    assert daemon.pid is not None
    proc = psutil.Process(daemon.pid)
    assert proc.environ()["CUDA_VISIBLE_DEVICES"] == f"{GPU_A},{GPU_B}"  # serves only the planned GPUs
    assert (run_dir / "log" / "control.log").exists()

    daemon.stop()
    assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE and proc.ppid() != os.getpid()
    assert not run_dir.exists()
    assert_nothing_left(run_dir / "pipe")
    daemon.stop()  # idempotent


def test_mkdtemp_when_no_run_dir_and_context_manager() -> None:
    with MpsDaemon(mps_plan(), control=FAKE) as daemon:
        pipe_dir = daemon.pipe_dir
        assert mps_status(pipe_dir, FAKE).answering
    assert not daemon.run_dir.exists()
    assert_nothing_left(pipe_dir)


def test_stop_before_start_is_a_no_op(run_dir: Path) -> None:
    daemon = MpsDaemon(mps_plan(), run_dir, control=FAKE)
    daemon.stop()
    daemon.stop()
    with pytest.raises(LaunchError, match="starts once"):
        daemon.start()


def test_reaped_when_launcher_is_child_subreaper(run_dir: Path) -> None:
    """As the launcher (a subreaper) the daemon is re-parented to us; stop() must reap it."""
    script = """
import ctypes, json, os, sys
from pathlib import Path
import psutil
from openclaw_launch.run.mps.daemon import MpsDaemon
from openclaw_launch.plan.model import MpsPlan
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
d = MpsDaemon(MpsPlan(None, None, None, "error", ()), Path(sys.argv[1]), control=sys.argv[2])
def zombies():
    return [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
d.start()
parent = psutil.Process(d.pid).ppid()
after_start = zombies()
d.stop()
print(json.dumps({"parent": parent, "me": os.getpid(), "after_start": after_start, "after_stop": zombies(),
                  "alive": psutil.pid_exists(d.pid)}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(run_dir), FAKE],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["parent"] == result["me"]
    assert result["after_start"] == []  # the -d intermediate, re-parented to us, is reaped at once
    assert result["after_stop"] == []
    assert result["alive"] is False


def test_second_daemon_on_same_pipe_dir_refused(run_dir: Path) -> None:
    first = MpsDaemon(mps_plan(), run_dir, control=FAKE)
    first.start()
    try:
        second = MpsDaemon(mps_plan(), run_dir, control=FAKE)
        with pytest.raises(LaunchError, match="already serves"):
            second.start()
        second.stop()  # owns nothing: must neither quit the first daemon nor remove its dirs
        assert mps_status(run_dir / "pipe", FAKE).answering
        assert len(find_mps_processes(run_dir / "pipe")) == 1
    finally:
        first.stop()
    assert_nothing_left(run_dir / "pipe")


def test_fake_refuses_second_dash_d_like_the_real_one(run_dir: Path) -> None:
    with MpsDaemon(mps_plan(), run_dir, control=FAKE) as daemon:
        again = subprocess.run([FAKE, "-d"], env=daemon.daemon_env(), capture_output=True, text=True, timeout=GUARD_S)
        assert again.returncode == 1
        assert "An instance of this daemon is already running" in again.stderr


def test_start_failure_is_a_launch_error_with_log_tail(run_dir: Path) -> None:
    daemon = MpsDaemon(mps_plan(), run_dir, control=FAKE, base_env=env_with(FAKE_MPS_FAIL_START="1"))
    with pytest.raises(LaunchError) as info:
        daemon.start()
    message = str(info.value)
    assert "exited with code 1" in message
    assert "fake failure requested" in message  # from control.log
    assert "mps_on_start_failure: warn" in message
    assert not run_dir.exists()
    assert_nothing_left(run_dir / "pipe")


def test_missing_binary(run_dir: Path) -> None:
    with pytest.raises(LaunchError, match="not found on PATH"):
        MpsDaemon(mps_plan(), run_dir, control=str(run_dir / "nvidia-cuda-mps-control")).start()


def test_warn_mode_runs_without_mps(run_dir: Path) -> None:
    plan = launch_plan([GPU_A], mps=mps_plan(on_start_failure="warn", gpu_uuids=(GPU_A,)))
    daemon, warning = start_mps(plan, run_dir, FAKE, base_env=env_with(FAKE_MPS_FAIL_START="1"))
    assert daemon is None
    assert warning is not None and "MPS is not running" in warning and "fake failure requested" in warning


def test_error_mode_raises(run_dir: Path) -> None:
    plan = launch_plan([GPU_A], mps=mps_plan(gpu_uuids=(GPU_A,)))
    with pytest.raises(LaunchError):
        start_mps(plan, run_dir, FAKE, base_env=env_with(FAKE_MPS_FAIL_START="1"))


def test_start_mps_without_mps_plan_does_nothing(run_dir: Path) -> None:
    assert start_mps(launch_plan([GPU_A]), run_dir, FAKE) == (None, None)
    assert not run_dir.exists()


def test_never_answering_daemon_times_out_and_is_killed(run_dir: Path) -> None:
    daemon = MpsDaemon(
        mps_plan(),
        run_dir,
        control=FAKE,
        start_timeout_s=1.0,
        stop_timeout_s=1.0,
        base_env=env_with(FAKE_MPS_NEVER_ANSWER="1"),
    )
    with pytest.raises(LaunchError, match="did not answer within 1.0 s"):
        daemon.start()
    assert_nothing_left(run_dir / "pipe")
    assert not run_dir.exists()


def test_stop_is_bounded_when_quit_is_never_answered(run_dir: Path) -> None:
    """A daemon that hangs on ``quit`` is SIGKILLed at the stop deadline and reaped."""
    daemon = MpsDaemon(
        mps_plan(), run_dir, control=FAKE, stop_timeout_s=0.5, base_env=env_with(FAKE_MPS_QUIT_DELAY_S="600")
    )
    daemon.start()
    pipe_dir = daemon.pipe_dir
    assert len(find_mps_processes(pipe_dir)) == 1
    daemon.stop()
    assert_nothing_left(pipe_dir)
    assert not run_dir.exists()


def test_on_launch_gets_the_cleanup_command_before_the_daemon_exists(run_dir: Path) -> None:
    """So the launcher's guardian can quit a daemon whose launcher is SIGKILLed while it starts."""
    seen: list[tuple[list[str], dict[str, str], str]] = []

    def on_launch(command: tuple[list[str], dict[str, str], str]) -> None:
        seen.append(command)
        assert find_mps_processes(run_dir / "pipe") == []

    with MpsDaemon(mps_plan(), run_dir, control=FAKE, on_launch=on_launch) as daemon:
        assert seen == [daemon.cleanup_command()]


def test_limits_applied(run_dir: Path) -> None:
    plan = mps_plan(active_thread_percentage=25, pinned_device_mem_limit="10G")
    with MpsDaemon(plan, run_dir, control=FAKE) as daemon:
        asked = run_control(
            FAKE,
            [
                "get_default_active_thread_percentage",
                "get_default_device_pinned_mem_limit 0",
                "get_default_device_pinned_mem_limit 1",
            ],
            daemon.daemon_env(),
            GUARD_S,
        )
        assert asked.returncode == 0
        assert asked.output.split() == ["25.0", "10G", "10G"]
        assert daemon.settings == {
            "get_default_active_thread_percentage": "25.0",
            "get_default_device_pinned_mem_limit 0": "10G",
            "get_default_device_pinned_mem_limit 1": "10G",
        }


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"pinned_device_mem_limit": "10GB"}, "integer followed by M or G"),
        ({"active_thread_percentage": 0}, "from 1 to 100"),
    ],
)
def test_invalid_limits_are_plan_errors(run_dir: Path, kw: dict[str, object], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        MpsDaemon(mps_plan(**kw), run_dir, control=FAKE).start()
    assert not run_dir.exists()


def test_pipe_dir_too_long_for_a_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    with pytest.raises(LaunchError, match="too long for a unix socket"):
        MpsDaemon(mps_plan(), deep, control=FAKE).start()
    assert not deep.exists()


def test_guardian_cleanup_command_quits_daemon_of_a_killed_launcher(run_dir: Path) -> None:
    """The launcher is SIGKILLed with the daemon up; the guardian's command alone must stop it."""
    script = """
import json, sys, time
from pathlib import Path
from openclaw_launch.run.mps.daemon import MpsDaemon
from openclaw_launch.plan.model import MpsPlan
d = MpsDaemon(MpsPlan(None, None, None, "error", ()), Path(sys.argv[1]), control=sys.argv[2])
d.start()
argv, env, stdin_text = d.cleanup_command()
print(json.dumps({"argv": argv, "env": env, "stdin": stdin_text}), flush=True)
time.sleep(600)
"""
    launcher = subprocess.Popen([sys.executable, "-c", script, str(run_dir), FAKE], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        cleanup = json.loads(launcher.stdout.readline())
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=GUARD_S)
    pipe_dir = run_dir / "pipe"
    assert len(find_mps_processes(pipe_dir)) == 1  # survived its launcher
    done = subprocess.run(cleanup["argv"], env=cleanup["env"], input=cleanup["stdin"], text=True, timeout=GUARD_S)
    assert done.returncode == 0
    wait_until_no_mps(pipe_dir)
    assert find_mps_processes(pipe_dir) == []


def test_status_reports_servers_clients_and_gpus(run_dir: Path) -> None:
    fake_state = env_with(FAKE_MPS_SERVERS="4242:11,12", FAKE_MPS_DEVICE_CLIENTS="0:11;1:12")
    with MpsDaemon(mps_plan(), run_dir, control=FAKE, base_env=fake_state) as daemon:
        status = daemon.status()
    assert status.answering
    assert status.daemon_pid == daemon.pid
    assert [(s.pid, s.clients) for s in status.servers] == [(4242, (11, 12))]
    assert status.client_count == 2
    assert status.clients_per_gpu == {GPU_A: 1, GPU_B: 1}


def test_status_when_nothing_answers(tmp_path: Path) -> None:
    status = mps_status(str(tmp_path), FAKE)
    assert not status.answering
    assert status.error is not None and "Cannot find MPS control daemon process" in status.error
    assert status.client_count == 0


def test_status_without_control_binary(tmp_path: Path) -> None:
    status = mps_status(tmp_path, str(tmp_path / "nvidia-cuda-mps-control"))
    assert not status.answering
    assert status.error is not None and "not found" in status.error


def test_parse_device_clients_as_driver_580_prints_them() -> None:
    text = "[0] 00:00.0, NVIDIA H200\n446.1\n447.1\n446.2\n[1] 00:00.0, NVIDIA H200\n[2] 00:00.0, X\n9.1\n"
    assert parse_device_clients(text, (GPU_A, GPU_B)) == {GPU_A: 2, GPU_B: 0}  # index 2 is not ours
    assert parse_device_clients(text, ()) == {}


# -- client limit (pure) ------------------------------------------------------


def rank(r: int, uuid: str | None) -> RankPlan:
    return rank_plan(r, gpu_uuid=uuid)


def launch_plan(gpus: list[str | None], mps: MpsPlan | None = None) -> LaunchPlan:
    return LaunchPlan(
        run_id="t",
        node="node0",
        node_rank=0,
        nnodes=1,
        world_size=len(gpus),
        master_addr="127.0.0.1",
        master_port=29500,
        backend="nccl",
        ranks=tuple(rank(i, g) for i, g in enumerate(gpus)),
        mps=mps,
        run_dir=run_context("t", "/tmp", None).run_dir,
    )


def test_clients_per_gpu_counts_ranks_and_lists_idle_gpus() -> None:
    plan = launch_plan([GPU_A, GPU_A], mps=mps_plan())
    assert clients_per_gpu(plan) == {GPU_A: 2, GPU_B: 0}
    assert clients_per_gpu(launch_plan([None, None])) == {}


def test_client_limit_enforced() -> None:
    assert check_client_limit(launch_plan([GPU_A, GPU_A, GPU_B], mps=mps_plan(max_clients_per_gpu=2))) == {
        GPU_A: 2,
        GPU_B: 1,
    }
    over = launch_plan([GPU_A, GPU_A, GPU_A, GPU_B], mps=mps_plan(max_clients_per_gpu=2))
    with pytest.raises(PlanError, match=rf"mps_max_clients_per_gpu is 2 .*{GPU_A}: 3.*procs_per_gpu"):
        check_client_limit(over)
    assert check_client_limit(launch_plan([GPU_A] * 5, mps=mps_plan())) == {GPU_A: 5, GPU_B: 0}


def test_start_mps_checks_the_limit_before_starting(run_dir: Path) -> None:
    over = launch_plan([GPU_A, GPU_A], mps=mps_plan(max_clients_per_gpu=1, on_start_failure="warn"))
    with pytest.raises(PlanError):
        start_mps(over, run_dir, FAKE)
    assert not run_dir.exists()
