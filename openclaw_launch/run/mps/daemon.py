"""The MPS control daemon's lifecycle: one private daemon per job, always quit and reaped.

The launcher owns ``nvidia-cuda-mps-control -d`` for the whole job (restarts keep
the same daemon). Its pipe and log directories are private to the job (mode
0700), so it can never collide with a system daemon in ``/tmp/nvidia-mps`` or
with another job's; the plan already gives every rank the client variables for
them (``plan/env.py``), so the daemon adds nothing to a rank. ``start()``
reaps the intermediate process of ``-d``, ``stop()`` the daemon (how they are
found: ``control.py``).

Beside it: ``control.py`` (the control program, the MPS processes of a pipe
dir), ``status.py`` (parsing the daemon's answers), ``commands.py`` (the plan's
client limit, setting checks and limit commands; pure).

Never changes compute mode or any other GPU setting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

import psutil

from openclaw_launch.errors import LaunchError
from openclaw_launch.plan.context import MPS_LOG_SUBDIR, MPS_PIPE_SUBDIR
from openclaw_launch.plan.model import LaunchPlan, MpsPlan
from openclaw_launch.run.mps.commands import check_client_limit, check_settings, limit_commands
from openclaw_launch.run.mps.control import (
    CONTROL_BINARY,
    FIX_HINT,
    SERVER_BINARY,
    ControlResult,
    control_env,
    daemon_from_pid_file,
    find_mps_processes,
    reap_zombie_children,
    resolve_control,
    run_control,
    wait_gone,
)
from openclaw_launch.run.mps.status import MpsStatus, mps_status
from openclaw_launch.single_thread import assert_single_threaded

CONTROL_LOG = "control.log"
# The daemon binds unix sockets in the pipe dir; the longest name it uses is
# "control_privileged" and sun_path holds 107 bytes. Over it the real daemon
# starts, fails to bind and only says "Cannot find MPS control daemon process".
_LONGEST_SOCKET = "control_privileged"
_SUN_PATH_MAX = 107
_LOG_TAIL_LINES = 20
CleanupCommand = tuple[list[str], dict[str, str], str]  # argv, env, stdin: quits the daemon


class MpsDaemon:
    """One private MPS control daemon for this job.

    ``start()`` makes it answer on ``pipe_dir``; ``stop()`` quits, reaps and
    removes everything it created, and is safe to call any number of times and
    on any path (success, failure, signal). Also a context manager.
    """

    def __init__(
        self,
        mps: MpsPlan,
        run_dir: Path | None = None,
        control: str | None = None,
        start_timeout_s: float = 10.0,
        stop_timeout_s: float = 10.0,
        base_env: Mapping[str, str] | None = None,
        on_launch: Callable[[CleanupCommand], object] | None = None,
    ):
        """``on_launch`` gets ``cleanup_command()`` just before the daemon is started, so a guardian
        can quit it even if the launcher is SIGKILLed while it starts."""
        self.mps = mps
        self._on_launch = on_launch
        self.control = control
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._run_dir = run_dir
        self._created: list[Path] = []
        self._binary: str | None = None
        self._daemon: psutil.Process | None = None
        self._started = False
        self._stopped = False
        self.settings: dict[str, str] = {}  # what the daemon reports for the limits we set

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            raise LaunchError("MpsDaemon has no directory yet: call start() first")
        return self._run_dir

    @property
    def pipe_dir(self) -> Path:
        return self.run_dir / MPS_PIPE_SUBDIR

    @property
    def log_dir(self) -> Path:
        return self.run_dir / MPS_LOG_SUBDIR

    @property
    def pid(self) -> int | None:
        """The control daemon's pid once it answers (None if it could not be identified)."""
        return self._daemon.pid if self._daemon else None

    def daemon_env(self) -> dict[str, str]:
        """The control daemon's environment: ours plus its private dirs and only the planned GPUs."""
        env = control_env(self.pipe_dir, self.log_dir, self._base_env)
        if self.mps.gpu_uuids:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.mps.gpu_uuids)
        return env

    def cleanup_command(self) -> CleanupCommand:
        """(argv, env, stdin) that quits this daemon; for the guardian if the launcher is SIGKILLed.

        It only quits the daemon (whose parent, then init or a subreaper, reaps
        it); the private directories stay for whoever removes the run's temp dir.
        """
        if self._binary is None:
            raise LaunchError("MpsDaemon.cleanup_command() needs a started daemon: call start() first")
        return [self._binary], control_env(self.pipe_dir, self.log_dir, self._base_env), "quit\n"

    def status(self) -> MpsStatus:
        return mps_status(
            self.pipe_dir, self._binary or self.control, base_env=self._base_env, gpu_uuids=self.mps.gpu_uuids
        )

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- start ---------------------------------------------------------------

    def start(self) -> None:
        """Start the daemon, wait until it answers, apply the limits.

        Raises LaunchError (with the daemon's log tail) and leaves nothing behind on failure.
        """
        if self._started or self._stopped:
            raise LaunchError("an MpsDaemon starts once; create a new one to start another daemon")
        check_settings(self.mps)
        try:
            self._binary = resolve_control(self.control)
            self._prepare_dirs()
            self._refuse_if_taken()
            self._started = True  # from here on there may be a daemon to stop
            if self._on_launch is not None:
                self._on_launch(self.cleanup_command())
            self._launch()
            self._wait_until_answering()
            self._apply_limits()
        except LaunchError as e:
            tail = self._log_tail() if self._started else ""
            self.stop()
            hint = "" if FIX_HINT in str(e) else FIX_HINT  # once, even when the cause already gave it
            raise LaunchError(f"{e}\n{tail}{hint}") from None
        except BaseException:
            self.stop()
            raise

    def _prepare_dirs(self) -> None:
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix="openclaw-mps-"))
            self._created.append(self._run_dir)
        if len(os.fsencode(self.pipe_dir / _LONGEST_SOCKET)) > _SUN_PATH_MAX:
            raise LaunchError(
                f"the MPS pipe directory {self.pipe_dir} is too long for a unix socket path "
                f"({_SUN_PATH_MAX} bytes with its socket names); use a shorter temp dir (e.g. TMPDIR=/tmp)"
            )
        for path in (self.run_dir, self.pipe_dir, self.log_dir):
            self._private_dir(path)

    def _private_dir(self, path: Path) -> None:
        """Create (or adopt) ``path`` as a 0700 directory of ours: other users must not reach the daemon."""
        if not path.exists():
            path.mkdir(mode=0o700, parents=True)
            self._created.append(path)
        st = path.stat()
        if st.st_uid != os.getuid():
            raise LaunchError(f"{path} belongs to uid {st.st_uid}, not to us; choose another run directory")
        path.chmod(0o700)

    def _refuse_if_taken(self) -> None:
        """Never start a second daemon on a pipe dir that already has one."""
        assert self._binary is not None
        owner = daemon_from_pid_file(self.pipe_dir, self._binary)
        probe = run_control(self._binary, ["get_server_list"], self.daemon_env(), self.start_timeout_s)
        if owner is not None or probe.returncode == 0:
            who = f" (pid {owner.pid})" if owner else ""
            raise LaunchError(
                f"an MPS control daemon{who} already serves {self.pipe_dir}; refusing to start a second "
                "one there. Stop it (echo quit | CUDA_MPS_PIPE_DIRECTORY=... nvidia-cuda-mps-control) "
                "or use another run directory."
            )

    def _launch(self) -> None:
        """Run ``control -d``: it forks the daemon off and returns.

        Its output goes to an anonymous file, not a pipe, so a daemon that keeps
        the inherited descriptor open cannot block us.
        """
        assert self._binary is not None
        assert_single_threaded("start the MPS control daemon")
        with tempfile.TemporaryFile(mode="w+") as out:
            try:
                proc = subprocess.Popen(
                    [self._binary, "-d"],
                    env=self.daemon_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                raise LaunchError(f"cannot run {self._binary} -d: {e}") from None
            try:
                rc = proc.wait(timeout=self.start_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise LaunchError(f"{self._binary} -d did not return within {self.start_timeout_s:.1f} s") from None
            out.seek(0)
            text = out.read().strip()
        if rc != 0:
            raise LaunchError(f"{self._binary} -d exited with code {rc}: {text or '(no output)'}")

    def _wait_until_answering(self) -> None:
        assert self._binary is not None
        deadline = time.monotonic() + self.start_timeout_s
        pause = 0.02
        while True:
            left = deadline - time.monotonic()
            probe = run_control(self._binary, ["get_server_list"], self.daemon_env(), left)
            if probe.returncode == 0:
                break
            if time.monotonic() + pause >= deadline:
                raise LaunchError(
                    f"the MPS control daemon did not answer within {self.start_timeout_s:.1f} s "
                    f"(last answer: {probe.output or 'none'})"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
        self._daemon = self._find_daemon()
        reap_zombie_children(Path(self._binary).name)

    def _find_daemon(self) -> psutil.Process | None:
        assert self._binary is not None
        by_file = daemon_from_pid_file(self.pipe_dir, self._binary)
        if by_file is not None:
            return by_file
        found = find_mps_processes(self.pipe_dir, (Path(self._binary).name,))
        return min(found, key=lambda p: p.create_time()) if found else None

    def _apply_limits(self) -> None:
        """Set the configured defaults; they apply to servers started after this, i.e. for our workers."""
        for set_cmd, get_cmd in limit_commands(self.mps):
            self._control_checked(set_cmd)
            self.settings[get_cmd] = self._control_checked(get_cmd)

    def query(self, *commands: str, timeout_s: float = 10.0) -> ControlResult:
        """Send commands to this daemon (e.g. ``get_server_list``) and return its answer."""
        if self._binary is None:
            raise LaunchError("MpsDaemon.query() needs a started daemon: call start() first")
        return run_control(self._binary, commands, self.daemon_env(), timeout_s)

    def _control_checked(self, command: str) -> str:
        result = self.query(command, timeout_s=self.start_timeout_s)
        if result.returncode != 0:
            raise LaunchError(f"the MPS control daemon rejected {command!r}: {result.output or '(no output)'}")
        return result.output

    def _log_tail(self) -> str:
        try:
            lines = (self.log_dir / CONTROL_LOG).read_text(errors="replace").splitlines()
        except OSError:
            return f"({self.log_dir / CONTROL_LOG} was not written)\n"
        tail = "\n".join(f"  {line}" for line in lines[-_LOG_TAIL_LINES:])
        return f"Last lines of {self.log_dir / CONTROL_LOG}:\n{tail}\n"

    # -- stop ----------------------------------------------------------------

    def stop(self) -> None:
        """Quit the daemon, reap it, SIGKILL what is left at the deadline, remove our directories."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._started:
                self._shutdown()
        finally:
            for path in self._created:
                shutil.rmtree(path, ignore_errors=True)

    def _shutdown(self) -> None:
        assert self._binary is not None
        deadline = time.monotonic() + self.stop_timeout_s
        if self._daemon is None:
            self._daemon = self._find_daemon()
        procs = self._owned_processes()
        if procs:
            run_control(self._binary, ["quit"], self.daemon_env(), min(self.stop_timeout_s, 5.0))
        procs = wait_gone(procs, deadline)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)  # psutil refuses if the pid was reused
        wait_gone(procs, time.monotonic() + 5.0)
        reap_zombie_children(Path(self._binary).name)

    def _owned_processes(self) -> list[psutil.Process]:
        procs = find_mps_processes(self.pipe_dir, (Path(self._binary or CONTROL_BINARY).name, SERVER_BINARY))
        if self._daemon is not None and all(p.pid != self._daemon.pid for p in procs):
            procs.append(self._daemon)  # may already be a zombie: still ours to reap
        return procs


def start_mps(
    plan: LaunchPlan,
    run_dir: Path | None = None,
    control: str | None = None,
    start_timeout_s: float = 10.0,
    base_env: Mapping[str, str] | None = None,
    on_launch: Callable[[CleanupCommand], object] | None = None,
) -> tuple[MpsDaemon | None, str | None]:
    """Start the plan's MPS daemon: (daemon, None), or (None, warning) under on_start_failure "warn".

    No MPS in the plan gives (None, None). The client limit is a plan error in both modes.
    """
    if plan.mps is None:
        return None, None
    check_client_limit(plan)
    daemon = MpsDaemon(
        plan.mps, run_dir, control, start_timeout_s=start_timeout_s, base_env=base_env, on_launch=on_launch
    )
    try:
        daemon.start()
    except LaunchError as e:
        if plan.mps.on_start_failure != "warn":
            raise
        return None, f"MPS is not running for this job (runtime.mps_on_start_failure: warn): {e}"
    return daemon, None
