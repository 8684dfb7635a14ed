"""The whole launcher, as users run it (`python -m openclaw_launch ...`), on real processes:
torchrun's environment, numactl binding in force, MPS owned end to end (stand-in control daemon
on PATH), reports, logs and restarts, and nothing left behind whatever ends the job."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from guards import wait_for
from test_plan_is_run import start_run
from test_supervise_run import recorded_pids, wait_gone
from test_supervise_signals import _unshare_works, finish, wait_files

from openclaw_launch.plan.env import TORCHRUN_ENV
from openclaw_launch.report.model import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "fake_worker.py")
FAKE_MPS = ROOT / "tests" / "fake_mps"
SNAPSHOT = ROOT / "configs" / "h200x2.snapshot.json"
TORCHRUN_VARS = sorted(TORCHRUN_ENV | {"OMP_NUM_THREADS"})


def env_with_fake_mps() -> dict[str, str]:
    return {**os.environ, "PATH": f"{FAKE_MPS}{os.pathsep}{os.environ['PATH']}"}


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return start_run(args, env)


def worker(*args: str) -> list[str]:
    return ["--no-python", "--", sys.executable, WORKER, *args]


def mps_config(tmp_path: Path) -> Path:
    """The recorded H200 host with MPS on: GPU ranks whose workers never touch a GPU."""
    text = (ROOT / "configs" / "h200x2.yaml").read_text()
    cfg = tmp_path / "mps.yaml"
    cfg.write_text(text.replace("enable_mps: false", "enable_mps: true\n  mps_max_clients_per_gpu: 2", 1))
    return cfg


def mps_daemons() -> list[psutil.Process]:
    """Live MPS control daemons of the launchers this test process started: those whose pipe
    directory lies under its TMPDIR (conftest.py: one per session or xdist worker), so that the
    jobs of a test running beside it never count."""
    ours = Path(tempfile.gettempdir())
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            pipe_dir = p.environ().get("CUDA_MPS_PIPE_DIRECTORY")
            named = any(Path(a).name == "nvidia-cuda-mps-control" for a in p.cmdline()[:2])
            if named and pipe_dir and Path(pipe_dir).is_relative_to(ours) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def wait_no_mps() -> None:
    wait_for(lambda: not mps_daemons(), "an MPS daemon outlived the launcher")


def test_workers_get_torchrun_env_and_their_numactl_binding(tmp_path: Path) -> None:
    proc = start("--nproc-per-node", "2", *worker("--write-env", f"{tmp_path}/env-{{rank}}.json"))
    code, out, err = finish(proc)
    assert code == 0, err
    for rank in (0, 1):
        env = json.loads((tmp_path / f"env-{rank}.json").read_text())
        environ = env["environ"]
        assert all(v in environ for v in TORCHRUN_VARS), set(TORCHRUN_VARS) - set(environ)
        assert environ["RANK"] == str(rank) and environ["WORLD_SIZE"] == "2"
        assert environ["OPENCLAW_BACKEND"] == "gloo"
        assert environ.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")  # a CPU host: left alone
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
    assert data["schema"] == SCHEMA and data["exit_code"] == 7
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
    # a signal waits for both ranks' files: a rank stopped while writing its pids file records none
    wait_files([tmp_path / "ready-0", *([] if how == "failure" else [tmp_path / "ready-1"])], proc)
    environ = json.loads((tmp_path / "env-0.json").read_text())["environ"]
    run_dir = Path(environ["TORCHELASTIC_ERROR_FILE"]).parents[3]  # errors/attempt-0/rank-0/error.json
    assert run_dir.exists()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    code, _, err = finish(proc)
    expected = {"failure": 3, "sigterm": 128 + signal.SIGTERM, "sigkill": -signal.SIGKILL}[how]
    assert code == expected, err
    pids = recorded_pids(tmp_path)
    assert len(pids) >= 2
    wait_gone(pids, f"outlived the launcher ({how})")
    wait_no_mps()
    wait_for(lambda: not run_dir.exists(), f"{run_dir} outlived the launcher ({how})")


def run_dir_of(run_id: str, proc: subprocess.Popen[str]) -> Path:
    return Path(tempfile.gettempdir()) / f"openclaw-{run_id}-{proc.pid}"


def wait_log_line(log: Path, text: str, proc: subprocess.Popen[str]) -> None:
    def said() -> bool:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"launcher exited {proc.returncode} before {log} said {text!r}:\n{out}\n{err}")
        return log.exists() and text in log.read_text()

    wait_for(said, f"{log} never said {text!r}")


@pytest.mark.skipif(not _unshare_works(), reason="unshare --pid --fork --mount-proc refused (needs root/userns)")
def test_cli_launcher_as_pid1_forwards_sigterm_and_reaps_orphans(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "openclaw_launch"]
        + ["--nproc-per-node", "2", "--grace-period-s", "2"]
        + worker("--orphan-child", f"{tmp_path}/orphan-{{rank}}", "--log-signals", f"{tmp_path}/sig-{{rank}}")
        + ["--ready-file", f"{tmp_path}/ready-{{rank}}", "--sleep", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_files([tmp_path / "ready-0", tmp_path / "ready-1"], proc)
    (launcher,) = psutil.Process(proc.pid).children()  # unshare itself does not forward signals
    assert os.readlink(f"/proc/{launcher.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    launcher.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    for rank in (0, 1):
        assert (tmp_path / f"sig-{rank}").read_text().split() == ["SIGTERM"]
        assert (tmp_path / f"orphan-{rank}").read_text() == "reaped"  # not left <defunct> by PID 1


def test_sigterm_during_a_slow_mps_start_starts_no_worker_and_leaves_nothing(tmp_path: Path) -> None:
    report = tmp_path / "run.json"
    proc = start(
        "--config",
        str(mps_config(tmp_path)),
        "--topology",
        str(SNAPSHOT),
        "--run-id",
        "slowmps",
        "--report",
        str(report),
        *worker("--ready-file", f"{tmp_path}/ready-{{rank}}", "--sleep", "60"),
        env={**env_with_fake_mps(), "FAKE_MPS_START_DELAY_S": "1"},
    )
    run_dir = run_dir_of("slowmps", proc)
    wait_log_line(run_dir / "mps" / "log" / "control.log", "Delaying start", proc)
    proc.send_signal(signal.SIGTERM)  # the launcher is waiting for `nvidia-cuda-mps-control -d`
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "received SIGTERM before the workers started" in err and "Traceback" not in err
    assert not list(tmp_path.glob("ready-*"))
    wait_no_mps()
    assert not run_dir.exists()
    data = json.loads(report.read_text())
    assert data["exit_code"] == 128 + signal.SIGTERM and data["signal_received"] == "SIGTERM"


def test_sigterm_while_mps_quits_after_success_still_exits_143(tmp_path: Path) -> None:
    proc = start(
        "--config",
        str(mps_config(tmp_path)),
        "--topology",
        str(SNAPSHOT),
        "--run-id",
        "slowquit",
        *worker(),
        env={**env_with_fake_mps(), "FAKE_MPS_QUIT_DELAY_S": "1"},
    )
    run_dir = run_dir_of("slowquit", proc)
    wait_log_line(run_dir / "mps" / "log" / "control.log", "Cmd:quit", proc)  # workers are done
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert "received SIGTERM while cleaning up" in err and "Traceback" not in err
    wait_no_mps()
    assert not run_dir.exists()


def test_restart_keeps_the_one_mps_daemon(tmp_path: Path) -> None:
    proc = start(
        "--config",
        str(mps_config(tmp_path)),
        "--topology",
        str(SNAPSHOT),
        "--max-restarts",
        "1",
        "--restart-backoff-s",
        "0",
        *worker(
            "--mps-probe",
            f"{tmp_path}/mps-{{rank}}-{{attempt}}.json",
            "--wait-for",  # rank 0 fails only once rank 1 has probed too (it would be SIGTERMed first)
            f"{tmp_path}/mps-1-{{attempt}}.json",
            "--only-rank",
            "0",
            "--fail-below-attempt",
            "1",
            "--exit",
            "5",
        ),
        env=env_with_fake_mps(),
    )
    code, _, err = finish(proc)
    assert code == 0, err
    probes = [json.loads((tmp_path / f"mps-{r}-{a}.json").read_text()) for r in (0, 1) for a in (0, 1)]
    assert all(p["alive"] for p in probes), probes  # not swept as a leftover after attempt 0
    assert len({p["pid"] for p in probes}) == 1, probes  # the same daemon, not a second one
    wait_no_mps()


def test_flooded_stdout_loses_no_line_and_no_exit(tmp_path: Path) -> None:
    megabytes = 50
    proc = start(
        "--nproc-per-node",
        "2",
        *worker(
            "--flood-mb",
            str(megabytes),
            "--ready-file",
            f"{tmp_path}/flooded-{{rank}}",
            "--only-rank",
            "1",
            "--wait-for",
            f"{tmp_path}/flooded-0",
            "--exit",
            "3",
            "--sleep",
            "60",
        ),
    )
    code, out, err = finish(proc)
    assert code == 3, err[-2000:]  # rank 1's exit was seen while rank 0's output poured in
    counts = {0: 0, 1: 0}
    line_re = re.compile(r"\[rank ([01])\] r\1 x{100}")
    for line in out.splitlines():
        match = line_re.fullmatch(line)
        assert match, f"a line was cut or interleaved: {line[:200]!r}"
        counts[int(match.group(1))] += 1
    per_rank = (1048576 // len(f"r0 {'x' * 100}\n")) * megabytes
    assert counts == {0: per_rank, 1: per_rank}


def test_unwritable_log_dir_exits_2_before_any_worker_starts(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "job1").write_text("a file where the run's log directory goes")
    proc = start(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(logs),
        "--run-id",
        "job1",
        *worker("--ready-file", f"{tmp_path}/ready-{{rank}}"),
    )
    code, _, err = finish(proc)
    assert code == 2, err
    assert "writable --log-dir" in err and "Traceback" not in err
    assert not list(tmp_path.glob("ready-*"))
    assert not run_dir_of("job1", proc).exists()


def test_error_file_of_record_reaches_the_summary(tmp_path: Path) -> None:
    proc = start("--nproc-per-node", "1", *worker("--error-file"))
    code, _, err = finish(proc)
    assert code == 1, err
    assert "error file" in err and "ValueError: bad batch shape (fake)" in err


def test_unwritable_report_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = start("--nproc-per-node", "1", "--report", str(tmp_path / "file" / "run.json"), *worker())
    code, _, err = finish(proc)
    assert code == 2, err  # found before the job, not after it
    assert "--report" in err and "cannot write there" in err and "Traceback" not in err
