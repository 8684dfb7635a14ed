"""The guardian: does nothing after "done", cleans up everything registered when its launcher dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from test_supervise_run import alive, wait_gone

from openclaw_launch.run.guard import Guardian


def test_done_means_nothing_is_cleaned(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        guardian = Guardian.start()
        guardian.watch_path(str(keep))
        guardian.watch_pgid(sleeper.pid)
        guardian.close()
        assert keep.exists()
        assert alive(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from openclaw_launch.run.guard import Guardian

    tmp, quit_file = sys.argv[1], sys.argv[2]
    guardian = Guardian.start()
    group = subprocess.Popen(["sleep", "60"], start_new_session=True)
    guardian.watch_pgid(group.pid)
    guardian.watch_path(os.path.join(tmp, "scratch"))
    forgotten = guardian.watch_command([sys.executable, "-c", "open(sys.argv[1], 'w')", quit_file + ".no"])
    guardian.unwatch_command(forgotten)
    copy_stdin = "import sys; open(sys.argv[1], 'w').write(sys.stdin.read() + sys.argv[2])"
    guardian.watch_command([sys.executable, "-c", copy_stdin, quit_file, "!"], stdin="quit\\n")
    print(group.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_launcher_death_runs_commands_kills_groups_removes_paths(tmp_path: Path) -> None:
    (tmp_path / "scratch").mkdir()
    quit_file = tmp_path / "quit"
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), str(quit_file)],
        capture_output=True,
        text=True,
        timeout=GUARD_S,  # would hang if the guardian kept the launcher's stdout open
    )
    assert launcher.returncode == -9, launcher.stderr
    group_pid = int(launcher.stdout.split()[0])
    wait_gone([group_pid])
    wait_for(lambda: not (tmp_path / "scratch").exists(), "the guardian never removed the scratch directory")
    assert quit_file.read_text() == "quit\n!"  # command ran with its stdin (before the groups were killed)
    assert not (tmp_path / "quit.no").exists()


def test_close_is_bounded_when_the_guardian_does_not_answer() -> None:
    """A stopped guardian never reads "done": close() SIGKILLs and reaps it instead of waiting forever."""
    guardian = Guardian.start()
    os.kill(guardian.pid, signal.SIGSTOP)
    guardian.close(timeout_s=0.2)
    with pytest.raises(ChildProcessError):  # reaped, not left <defunct>
        os.waitpid(guardian.pid, os.WNOHANG)


def test_a_command_bigger_than_a_pipe_buffer_reaches_the_guardian(tmp_path: Path) -> None:
    """The MPS quit command carries the launcher's whole environment: it must arrive whole."""
    out = tmp_path / "out"
    (tmp_path / "count.py").write_text(
        "import os, sys\nopen(sys.argv[1] + '.tmp', 'w').write(str(len(os.environ['BIG'])))\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    )
    script = textwrap.dedent(
        """
        import os, signal, sys
        from openclaw_launch.run.guard import Guardian
        guardian = Guardian.start()
        guardian.watch_command([sys.executable, sys.argv[1], sys.argv[2]], env={"BIG": "x" * 100_000})
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "count.py"), str(out)], capture_output=True, timeout=GUARD_S
    )
    assert done.returncode == -9, done.stderr
    wait_for(out.exists, "the guardian did not run the command")
    assert out.read_text() == "100000"
