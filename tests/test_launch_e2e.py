"""The whole launcher, as users run it (`python -m openclaw_launch ...`), on real processes:
torchrun's environment, numactl binding in force, MPS owned end to end (stand-in control daemon
on PATH), reports, logs and restarts, and nothing left behind whatever ends the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_supervise_run import HANG_GUARD_S, wait_gone
from test_supervise_signals import finish, wait_files

from openclaw_launch.env import TORCHRUN_ENV

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "fake_worker.py")
FAKE_MPS = ROOT / "tests" / "fake_mps"
SNAPSHOT = ROOT / "configs" / "h200x2.snapshot.json"
TORCHRUN_VARS = sorted(TORCHRUN_ENV | {"OMP_NUM_THREADS"})


def env_with_fake_mps() -> dict[str, str]:
    return {**os.environ, "PATH": f"{FAKE_MPS}{os.pathsep}{os.environ['PATH']}"}


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker(*args: str) -> list[str]:
    return ["--no-python", "--", sys.executable, WORKER, *args]


def mps_config(tmp_path: Path) -> Path:
    """The recorded H200 host with MPS on: GPU ranks whose workers never touch a GPU."""
    text = (ROOT / "configs" / "h200x2.yaml").read_text()
    cfg = tmp_path / "mps.yaml"
    cfg.write_text(text.replace("enable_mps: false", "enable_mps: true\n  mps_max_clients_per_gpu: 2", 1))
    return cfg


def mps_daemons() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "nvidia-cuda-mps-control" in cmd and p.info["name"] != "pytest":
            out.append(p)
    return out


def wait_no_mps() -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while [p for p in mps_daemons() if p.status() != psutil.STATUS_ZOMBIE]:
        assert time.monotonic() < deadline, "an MPS daemon outlived the launcher"
        time.sleep(0.05)


def test_workers_get_torchrun_env_and_their_numactl_binding(tmp_path: Path) -> None:
    proc = start("--nproc-per-node", "2", *worker("--write-env", f"{tmp_path}/env-{{rank}}.json"))
    code, out, err = finish(proc)
    assert code == 0, err
    for rank in (0, 1):
        env = json.loads((tmp_path / f"env-{rank}.json").read_text())
        environ = env["environ"]
        assert all(v in environ for v in TORCHRUN_VARS), set(TORCHRUN_VARS) - set(environ)
        assert environ["RANK"] == str(rank) and environ["WORLD_SIZE"] == "2"
        assert environ["OPENCLAW_BACKEND"] == "gloo" and environ["CUDA_VISIBLE_DEVICES"] == ""
        if len(os.sched_getaffinity(0)) >= 2:  # each rank on its own core, as planned, in force
            assert env["Cpus_allowed_list"] == environ["OPENCLAW_CPUS"]


def test_failure_report_is_written_and_exit_code_is_the_workers(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    proc = start(
        "--nproc-per-node",
        "2",
        "--grace-period-s",
        "1",
        "--report",
        str(report),
        *worker("--only-rank", "1", "--exit", "7", "--stderr", "boom", "--sleep", "30"),
    )
    code, _, err = finish(proc)
    assert code == 7, err
    assert "root cause: rank 1" in err and "boom" in err
    data = json.loads(report.read_text())
    assert data["schema"] == "openclaw-report/1" and data["exit_code"] == 7
    assert data["root_cause"]["rank"] == 1
    assert not list(tmp_path.glob(".run.json*"))  # atomic: no temp file left


def test_restart_then_success_with_per_attempt_logs(tmp_path: Path) -> None:
    proc = start(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--restart-backoff-s",
        "0",
        "--log-dir",
        str(tmp_path),
        "--run-id",
        "job1",
        *worker(
            "--only-rank",
            "0",
            "--fail-below-attempt",
            "1",
            "--exit",
            "5",
            "--stdout",
            "hello",
            "--write-env",
            f"{tmp_path}/env-{{rank}}-{{attempt}}.json",
        ),
    )
    code, out, err = finish(proc)
    assert code == 0, err
    for attempt in (0, 1):
        assert (tmp_path / "job1" / f"attempt-{attempt}" / "rank-0" / "stdout.log").read_text().strip() == "hello"
        env = json.loads((tmp_path / f"env-0-{attempt}.json").read_text())["environ"]
        assert env["TORCHELASTIC_RESTART_COUNT"] == str(attempt)
    assert "[rank 0] hello" in out


def test_mps_daemon_owned_for_the_job_and_gone_after(tmp_path: Path) -> None:
    cfg = mps_config(tmp_path)
    proc = start(
        "--config",
        str(cfg),
        "--topology",
        str(SNAPSHOT),
        *worker("--write-env", f"{tmp_path}/env-{{rank}}.json"),
        env=env_with_fake_mps(),
    )
    code, _, err = finish(proc)
    assert code == 0, err
    env = json.loads((tmp_path / "env-0.json").read_text())
    environ = env["environ"]
    pipe_dir = Path(environ["CUDA_MPS_PIPE_DIRECTORY"])
    assert environ["CUDA_VISIBLE_DEVICES"].startswith("GPU-584f87b1")
    assert not pipe_dir.exists()  # private directory removed
    wait_no_mps()


@pytest.mark.parametrize("how", ["failure", "sigterm", "sigkill"])
def test_no_worker_daemon_or_temp_dir_outlives_the_launcher(tmp_path: Path, how: str) -> None:
    cfg = mps_config(tmp_path)
    fail = ["--only-rank", "1", "--exit", "3", "--wait-for", f"{tmp_path}/ready-0"] if how == "failure" else []
    proc = start(
        "--config",
        str(cfg),
        "--topology",
        str(SNAPSHOT),
        "--grace-period-s",
        "1",
        *worker(
            "--grandchildren",
            "1",
            "--pids-file",
            f"{tmp_path}/pids-{{rank}}",
            "--write-env",
            f"{tmp_path}/env-{{rank}}.json",
            "--ready-file",
            f"{tmp_path}/ready-{{rank}}",
            *fail,
            "--sleep",
            "60",
        ),
        env=env_with_fake_mps(),
    )
    wait_files([tmp_path / "ready-0"], proc)
    environ = json.loads((tmp_path / "env-0.json").read_text())["environ"]
    run_dir = Path(environ["TORCHELASTIC_ERROR_FILE"]).parents[2]
    assert run_dir.exists()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    code, _, err = finish(proc)
    expected = {"failure": 3, "sigterm": 128 + signal.SIGTERM, "sigkill": -signal.SIGKILL}[how]
    assert code == expected, err
    pids = []
    for f in tmp_path.glob("pids-*"):
        recorded = json.loads(f.read_text())
        pids += [recorded["worker"], *recorded["grandchildren"]]
    assert len(pids) >= 2
    assert wait_gone(pids) == [], f"outlived the launcher ({how})"
    wait_no_mps()
    deadline = time.monotonic() + HANG_GUARD_S
    while run_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not run_dir.exists()
