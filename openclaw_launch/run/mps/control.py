"""Talking to ``nvidia-cuda-mps-control`` and finding the MPS processes of one pipe directory.

The control program reads commands on stdin and prints the daemon's answers
(``run_control``). How the daemon's pid is found (needed to reap it, and to
kill it when ``quit`` is not answered): the real control daemon writes
``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid``; the pid is accepted
only if that process is the control binary *and* its environment names our
pipe directory (guards against a stale file and pid reuse). Without the file,
the process table is searched with the same test. ``-d`` forks twice; when the
launcher is a child subreaper, both the intermediate process and the daemon are
re-parented to it, and an unreaped one stays ``<defunct>`` (seen on the H200
host): ``reap_zombie_children`` and ``wait_gone`` reap them, each with
``waitpid`` on that pid only (never ``waitpid(-1)``, which would steal the
supervisor's workers).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from openclaw_launch.errors import LaunchError
from openclaw_launch.single_thread import assert_single_threaded

CONTROL_BINARY = "nvidia-cuda-mps-control"
SERVER_BINARY = "nvidia-cuda-mps-server"
PID_FILE = "nvidia-cuda-mps-control.pid"
FIX_HINT = (
    "Fix the cause shown above, or set runtime.mps_on_start_failure: warn to run the job "
    "without MPS, or runtime.enable_mps: false."
)


@dataclass(frozen=True)
class ControlResult:
    returncode: int
    output: str  # stdout + stderr


def resolve_control(control: str | None = None) -> str:
    """The control binary's path (``control`` may be a name on PATH or a path)."""
    found = shutil.which(control or CONTROL_BINARY)
    if found is None:
        raise LaunchError(
            f"{control or CONTROL_BINARY} was not found on PATH. Install the NVIDIA driver's compute "
            f"utilities (they ship {CONTROL_BINARY}) or put it on PATH. {FIX_HINT}"
        )
    return found


def run_control(control: str, commands: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ControlResult:
    """Send ``commands`` (one per line) to the daemon via the control program's stdin.

    A daemon that does not answer makes the control program hang: it is killed
    at ``timeout_s`` and reported as return code 124, like timeout(1).
    """
    assert_single_threaded(f"run {Path(control).name}")
    try:
        done = subprocess.run(
            [control],
            input="".join(f"{c}\n" for c in commands),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=max(timeout_s, 0.01),
            start_new_session=True,  # a Ctrl-C meant for the job must not hit it
        )
    except subprocess.TimeoutExpired:
        return ControlResult(124, f"{Path(control).name} did not answer within {timeout_s:.1f} s")
    except OSError as e:
        return ControlResult(127, f"cannot run {control}: {e}")
    return ControlResult(done.returncode, (done.stdout + done.stderr).strip())


def control_env(
    pipe_dir: Path, log_dir: Path | None = None, base_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    env = dict(os.environ if base_env is None else base_env)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe_dir)
    if log_dir is not None:
        env["CUDA_MPS_LOG_DIRECTORY"] = str(log_dir)
    return env


def find_mps_processes(pipe_dir: Path, names: Sequence[str] = (CONTROL_BINARY, SERVER_BINARY)) -> list[psutil.Process]:
    """Live (non-zombie) processes named one of ``names`` that serve ``pipe_dir``.

    Matching needs both the program name (first two argv words, so an
    interpreter-run stand-in matches too) and ``CUDA_MPS_PIPE_DIRECTORY`` in
    its environment: workers carry the same variable but are not MPS programs.
    """
    found = []
    for proc in psutil.process_iter():
        if _serves(proc, pipe_dir, names):
            found.append(proc)
    return found


def _serves(proc: psutil.Process, pipe_dir: Path, names: Sequence[str]) -> bool:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        argv = proc.cmdline()
        if not any(Path(a).name in names for a in argv[:2]):
            return False
        return proc.environ().get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe_dir)
    except (psutil.Error, OSError):
        return False


def daemon_from_pid_file(pipe_dir: Path, control: str) -> psutil.Process | None:
    try:
        proc = psutil.Process(int((pipe_dir / PID_FILE).read_text().strip()))
    except (OSError, ValueError, psutil.Error):
        return None
    return proc if _serves(proc, pipe_dir, (Path(control).name,)) else None


def _gone(proc: psutil.Process) -> bool:
    """Reap ``proc`` if it is our child; True once it no longer runs."""
    try:
        pid, _ = os.waitpid(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            return True
    except ChildProcessError:
        pass  # not our child: its parent (init or a subreaper) reaps it, zombie or not
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def reap_zombie_children(binary_name: str) -> None:
    """Reap our zombie children named like the control binary.

    ``-d`` forks twice (seen with driver 580): the foreground process (reaped by
    us) and an intermediate that exits once the daemon runs. The intermediate is
    re-parented to a subreaper launcher, which is the ``<defunct>`` seen on the
    H200 host; zombies have no cmdline, so only the name (kernel comm, 15 chars) tells.
    """
    names = {binary_name, binary_name[:15]}
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if child.status() == psutil.STATUS_ZOMBIE and child.name() in names:
                os.waitpid(child.pid, os.WNOHANG)


def wait_gone(procs: list[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Poll until every process is gone or the deadline passes; return those still there."""
    left = [p for p in procs if not _gone(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if not _gone(p)]
    return left
