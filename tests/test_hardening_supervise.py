"""Issue 8, supervision: the launcher never stalls or dies on its own I/O (real processes)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_runner import invoke
from guards import GUARD_S, wait_for
from supervise_driver import make_plan

from openclaw_launch.files import check_output_path, write_atomic
from openclaw_launch.report.build import build_report
from openclaw_launch.run.console import Console
from openclaw_launch.run.guard import Guardian
from openclaw_launch.run.osproc import RealOs
from openclaw_launch.run.supervise import SuperviseOptions, supervise

ROOT = Path(__file__).resolve().parent.parent


def launcher(args: list[str], preexec=None, **kw: object) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", *args],
        cwd=ROOT,
        preexec_fn=preexec,
        **kw,  # type: ignore[call-overload]
    )


def py(code: str) -> list[str]:
    """A worker running ``code`` (RANK in the environment)."""
    return ["--no-python", "--", sys.executable, "-c", textwrap.dedent(code)]


def wait(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("the launcher hung")


def test_unread_stdout_pipe_never_stalls_teardown_and_logs_keep_everything(tmp_path: Path) -> None:
    code = """
        import os, sys, time
        if os.environ["RANK"] == "1":
            for i in range(20000):
                sys.stdout.write(f"line {i} " + "x" * 100 + "\\n")
            sys.stdout.flush()
            sys.exit(3)
        time.sleep(120)
    """
    r, w = os.pipe()  # the launcher's stdout: nobody reads it
    report = tmp_path / "report.json"
    args = ["--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"), "--run-id", "j", "--report", str(report)]
    proc = launcher([*args, *py(code)], stdout=w, stderr=subprocess.DEVNULL)
    os.close(w)
    try:
        assert wait(proc) == 3
    finally:
        os.close(r)
    log = tmp_path / "logs" / "j" / "attempt-0" / "rank-1" / "stdout.log"
    assert log.read_text().count("\n") == 20000  # the log lost nothing
    data = json.loads(report.read_text())
    assert data["console_dropped_lines"] >= 0  # queued (bounded) or dropped: never blocked
    assert data["root_cause"]["rank"] == 1 and data["root_cause"]["exit_code"] == 3


def test_console_queues_without_blocking_and_counts_drops() -> None:
    import fcntl

    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: a small pipe
    stream = os.fdopen(w, "w")
    console = Console(stream, max_queue=8192, logs_hint="/logs/j", stall_s=0.0)  # stalled at once
    for i in range(2000):  # far more than the pipe and the queue take: must return, not block
        console.write(f"line {i} {'y' * 60}\n")
    assert console.dropped_lines > 0 and console.pending
    got = b""
    while console.pending:
        got += os.read(r, 65536)
        console.flush()
    os.set_blocking(r, False)
    while True:  # what the last flush wrote (the notice)
        try:
            got += os.read(r, 65536)
        except BlockingIOError:
            break
    assert b"line(s) dropped" in got and b"full logs in /logs/j" in got
    stream.close()
    os.close(r)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("needs root and tmpfs mounts")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_log_disk_warns_once_and_the_job_goes_on(tmp_path: Path, tiny_tmpfs: Path) -> None:
    code = """
        import sys
        for i in range(30000):
            sys.stdout.write(f"line {i} " + "z" * 80 + "\\n")
        print("last line", flush=True)
    """
    report = tmp_path / "report.json"
    args = ["--nproc-per-node", "2", "--log-dir", str(tiny_tmpfs), "--run-id", "j", "--report", str(report)]
    proc = launcher([*args, *py(code)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=GUARD_S)
    text = err.decode()
    assert proc.returncode == 0, text
    assert text.count("cannot write the worker log") == 1 and "Traceback" not in text
    assert out.decode().count("last line") == 2  # the console kept going
    assert json.loads(report.read_text())["log_errors"]


def _blocked_sigchld_parent() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGTERM})
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def test_parent_that_blocks_and_ignores_sigchld_does_not_hang_the_launcher() -> None:
    code = """
        import os, time
        os.close(1); os.close(2)  # no EOF-driven wake-up: only SIGCHLD tells
        time.sleep(0.3)
    """
    proc = launcher(["--nproc-per-node", "2", *py(code)], preexec=_blocked_sigchld_parent)
    assert wait(proc) == 0


def test_nohup_sighup_is_honoured(tmp_path: Path) -> None:
    code = f"""
        import os, time
        open("{tmp_path}/ready-" + os.environ["RANK"], "w").close()
        while not os.path.exists("{tmp_path}/go"):
            time.sleep(0.01)
    """
    proc = launcher(["--nproc-per-node", "1", *py(code)], preexec=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for(lambda: (tmp_path / "ready-0").exists() or proc.poll() is not None, "the worker never started")
    os.kill(proc.pid, signal.SIGHUP)
    (tmp_path / "go").touch()
    assert wait(proc) == 0


def test_closed_stderr_keeps_the_workers_exit_code() -> None:
    proc = launcher(["--nproc-per-node", "2", *py("raise SystemExit(3)")], preexec=lambda: os.close(2))
    assert wait(proc) == 3


def test_error_file_is_read_bounded_and_never_blocks(tmp_path: Path) -> None:
    fs = RealOs()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert fs.read_error_file(str(fifo)) is None  # a FIFO is not opened for a blocking read
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    assert fs.read_error_file(str(zero)) is None
    big = tmp_path / "big.json"
    big.write_text("x" * (1 << 20))
    text = fs.read_error_file(str(big))
    assert text is not None and len(text) < 70_000 and "cut at 64 KiB" in text


def test_guardian_death_is_noticed_and_reported() -> None:
    guardian = Guardian.start()
    os.kill(guardian.pid, signal.SIGKILL)
    os.waitid(os.P_PID, guardian.pid, os.WEXITED | os.WNOWAIT)  # dead (not yet reaped)
    err = __import__("io").StringIO()
    options = SuperviseOptions(stderr=err, stdout=__import__("io").StringIO())
    plan = make_plan(1, ["--stdout", "ok"])
    result = supervise(plan, options, guardian=guardian)  # type: ignore[arg-type]
    guardian.close()
    assert result.exit_code == 0
    assert result.guardian_lost is not None and "guardian" in err.getvalue()
    assert build_report(plan, result, None, result.exit_code).guardian_lost == result.guardian_lost  # type: ignore[arg-type]


def test_restarts_print_a_line_and_the_report_keeps_every_attempt() -> None:
    import io

    err = io.StringIO()
    options = SuperviseOptions(stderr=err, stdout=io.StringIO(), max_restarts=2, restart_backoff_s=0)
    plan = make_plan(2, ["--exit", "3", "--only-rank", "1"])
    result = supervise(plan, options)  # type: ignore[arg-type]
    assert result.attempts == 3 and result.exit_code == 3
    assert "attempt 2/3 after rank 1 exited 3" in err.getvalue()
    assert "attempt 3/3 after rank 1 exited 3" in err.getvalue()
    history = build_report(plan, result, None, result.exit_code).attempt_history  # type: ignore[arg-type]
    assert [a.root_cause.rank if a.root_cause else None for a in history] == [1, 1, 1]
    assert all(len(a.ranks) == 2 and a.ranks[0].wall_s is not None for a in history)


def test_only_groups_still_ours_are_signalled(tmp_path: Path) -> None:
    """After a worker is reaped its group id is ours only while a descendant of ours is in it."""
    fs = RealOs()
    old = fs.set_child_subreaper(True)
    try:
        spawned = fs.spawn(["sh", "-c", "sleep 30 & echo started"], {})
        os.waitpid(spawned.pid, 0)  # the leader is reaped; its sleep is still in the group
        assert spawned.pid in fs.descendant_groups()
        fs.killpg(spawned.pid, signal.SIGKILL)
        # until the sleep is dead (a zombie counts as gone)
        wait_for(lambda: spawned.pid not in fs.descendant_groups(), "the killed group's sleep never died")
        fs.reap()
        assert spawned.pid not in fs.descendant_groups()  # now the id is no longer ours
    finally:
        fs.set_child_subreaper(old)
        for fd in (spawned.stdout_fd, spawned.stderr_fd):
            if fd is not None:
                os.close(fd)


def test_output_files_honour_umask_and_go_through_symlinks_and_devices(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o644
    (tmp_path / "link").symlink_to(tmp_path / "real.json")
    write_atomic(tmp_path / "link", "data")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "real.json").read_text() == "data"
    write_atomic("/dev/null", "data")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert check_output_path("/dev/null") is None
    assert "directory" in (check_output_path(tmp_path) or "")
    assert "under /proc" in (check_output_path("/proc/self/report.json") or "")
    (tmp_path / "file").write_text("")
    assert "not a directory" in (check_output_path(tmp_path / "file" / "r.json") or "")


def test_bad_report_path_fails_before_any_worker_starts(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"open('{ready}', 'w').close()"
    proc = invoke("--nproc-per-node", "1", "--report", "/proc/self/nope.json", *py(code))
    assert proc.returncode == 2 and "--report" in proc.stderr and "Traceback" not in proc.stderr
    assert not ready.exists()


def test_plan_to_a_full_device_is_an_error_not_a_traceback() -> None:
    with open("/dev/full", "w") as full:
        proc = launcher(["plan", "--nproc-per-node", "2", "--json", "x.py"], stdout=full, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 1 and b"cannot write the output" in err and b"Traceback" not in err
