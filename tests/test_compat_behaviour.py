"""What torchrun users rely on besides the command line, with real processes: two one-node jobs on
one host, a 30 s grace period for a checkpointing SIGTERM handler, output of a SIGKILLed worker, a
progress bar drawn with \\r, and the launcher's own TORCHELASTIC_ERROR_FILE."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_supervise_signals import finish, wait_files

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/compat_worker.py"
HANG_GUARD_S = 60.0


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_one_node_jobs_on_one_host_both_succeed() -> None:
    """Each gets its own free MASTER_PORT; both gloo worlds form (the old fixed 29500 collided)."""
    pytest.importorskip("torch")
    jobs = [start("--nproc-per-node", "2", "tests/allreduce_worker.py") for _ in range(2)]
    for job in jobs:
        code, out, err = finish(job)
        assert code == 0, err
        assert "sum 1" in out


def test_sigterm_handler_gets_torchruns_30s_grace(tmp_path: Path) -> None:
    """A worker checkpointing 6 s after SIGTERM (longer than the old 5 s default) finishes it."""
    ready, saved = tmp_path / "ready", tmp_path / "saved"
    proc = start(
        "--nproc-per-node",
        "1",
        WORKER,
        "--checkpoint-on-sigterm",
        "6",
        str(saved),
        "--ready-file",
        str(ready),
    )
    wait_files([ready], proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert saved.read_text() == "saved"


def test_shutdown_timeout_variable_sets_the_grace_period(tmp_path: Path) -> None:
    ready, saved = tmp_path / "ready", tmp_path / "saved"
    args = ["--nproc-per-node", "1", WORKER, "--checkpoint-on-sigterm", "30", str(saved), "--ready-file", str(ready)]
    proc = start(*args, env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0"})
    wait_files([ready], proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)  # SIGKILLed at once: well before the handler's 30 s
    assert code == 128 + signal.SIGTERM, err
    assert not saved.exists()


def test_sigkilled_worker_output_without_newline_is_in_console_and_log(tmp_path: Path) -> None:
    proc = start(
        "--nproc-per-node",
        "1",
        "--log-dir",
        str(tmp_path),
        "--run-id",
        "k",
        WORKER,
        "--partial-then-sigkill",
        "last words",
    )
    code, out, err = finish(proc)
    assert code == 128 + signal.SIGKILL, err
    assert "[rank 0] last words\n" in out
    assert (tmp_path / "k" / "attempt-0" / "rank-0" / "stdout.log").read_text() == "last words"


def test_progress_redrawn_with_carriage_return_reaches_the_console_while_running(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    proc = start("--nproc-per-node", "1", WORKER, "--redraw-until", str(stop))
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + HANG_GUARD_S
    while "step 2" not in seen:  # shown before any newline was written
        assert time.monotonic() < deadline, f"no progress on the console: {seen!r}"
        if select.select([proc.stdout], [], [], 0.1)[0]:
            seen += os.read(proc.stdout.fileno(), 4096).decode()
    stop.touch()
    code, out, err = finish(proc)
    assert code == 0, err
    assert "\r[rank 0] step " in seen


def test_parent_error_file_gets_the_root_cause_and_log_dir_keeps_the_workers(tmp_path: Path) -> None:
    parent = tmp_path / "parent-error.json"
    logs = tmp_path / "logs"
    proc = start(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(logs),
        "--run-id",
        "e",
        "--no-python",
        sys.executable,
        "tests/fake_worker.py",
        "--only-rank",
        "1",
        "--error-file",
        "--sleep",
        "30",
        env={"TORCHELASTIC_ERROR_FILE": str(parent)},
    )
    code, _, err = finish(proc)
    assert code != 0
    data = json.loads(parent.read_text())
    assert data["message"]["errorCode"] == code
    worker_file = logs / "e" / "errors" / "rank-1" / "error.json"
    assert worker_file.exists() and f"error file {worker_file}" in err


def test_without_log_dir_the_summary_names_no_deleted_file(tmp_path: Path) -> None:
    parent = tmp_path / "parent-error.json"
    args = ["--nproc-per-node", "1", "--no-python", sys.executable, "tests/fake_worker.py", "--exit", "3"]
    code, _, err = finish(start(*args, env={"TORCHELASTIC_ERROR_FILE": str(parent)}))
    assert code == 3 and "root cause: rank 0" in err
    assert "error.json" not in err
    message = json.loads(parent.read_text())["message"]
    assert (
        message["message"].startswith("ChildFailedError")
        and "exited with code 3" in message["extraInfo"]["py_callstack"]
    )
