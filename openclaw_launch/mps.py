"""The MPS control daemon's lifecycle: one private daemon per job, always quit and reaped.

The launcher owns ``nvidia-cuda-mps-control -d`` for the whole job (restarts keep
the same daemon). Its pipe and log directories are private to the job (mode
0700), so it can never collide with a system daemon in ``/tmp/nvidia-mps`` or
with another job's; workers reach it through ``worker_env()``.

How the daemon's pid is found (needed to reap it, and to kill it when ``quit``
is not answered): the real control daemon writes
``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid``; the pid is accepted
only if that process is the control binary *and* its environment names our
pipe directory (guards against a stale file and pid reuse). Without the file,
the process table is searched with the same test. ``-d`` forks twice; when the
launcher is a child subreaper, both the intermediate process and the daemon are
re-parented to it, and an unreaped one stays ``<defunct>`` (seen on the H200
host): ``start()`` reaps the intermediate, ``stop()`` the daemon, each with
``waitpid`` on that pid only (never ``waitpid(-1)``, which would steal the
supervisor's workers).

Never changes compute mode or any other GPU setting.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

from openclaw_launch.config import active_thread_percentage_problem, pinned_limit_problem, procs_per_gpu_problem
from openclaw_launch.errors import LaunchError, PlanError
from openclaw_launch.plan import LaunchPlan, MpsPlan

CONTROL_BINARY = "nvidia-cuda-mps-control"
SERVER_BINARY = "nvidia-cuda-mps-server"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_LOG = "control.log"
# The daemon binds unix sockets in the pipe dir; the longest name it uses is
# "control_privileged" and sun_path holds 107 bytes. Over it the real daemon
# starts, fails to bind and only says "Cannot find MPS control daemon process".
_LONGEST_SOCKET = "control_privileged"
_SUN_PATH_MAX = 107
_DEVICE_LINE = re.compile(r"\s*\[(\d+)\]")
_CLIENT_LINE = re.compile(r"(\d+)(?:\.\d+)?")
_LOG_TAIL_LINES = 20
CleanupCommand = tuple[list[str], dict[str, str], str]  # argv, env, stdin: quits the daemon
_FIX_HINT = (
    "Fix the cause shown above, or set runtime.mps_on_start_failure: warn to run the job "
    "without MPS, or runtime.enable_mps: false."
)


@dataclass(frozen=True)
class MpsServer:
    pid: int
    clients: tuple[int, ...]  # client pids connected to this server


@dataclass(frozen=True)
class MpsStatus:
    """What ``validate`` reports about a daemon: is it answering, who is connected."""

    answering: bool
    daemon_pid: int | None
    servers: tuple[MpsServer, ...] = ()
    device_clients: str | None = None  # raw get_device_client_list output, for humans
    clients_per_gpu: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> clients, where listed
    error: str | None = None  # why it is not answering (the control program's output)

    @property
    def client_count(self) -> int:
        return sum(len(s.clients) for s in self.servers)


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
            f"utilities (they ship {CONTROL_BINARY}) or put it on PATH. {_FIX_HINT}"
        )
    return found


def run_control(control: str, commands: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ControlResult:
    """Send ``commands`` (one per line) to the daemon via the control program's stdin.

    A daemon that does not answer makes the control program hang: it is killed
    at ``timeout_s`` and reported as return code 124, like timeout(1).
    """
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


def _pids(text: str) -> tuple[int, ...]:
    return tuple(int(tok) for tok in text.split() if tok.isdigit())


def parse_device_clients(text: str, gpu_uuids: Sequence[str]) -> dict[str, int]:
    """GPU UUID -> client count from ``get_device_client_list`` output.

    Driver 580 prints a line ``[<index>] <bus>, <name>`` per device and then one
    ``<pid>.<context>`` line per client context. The index is the daemon's own
    device numbering, i.e. a position in its CUDA_VISIBLE_DEVICES
    (``gpu_uuids``; checked on 2xH200 with the order reversed); devices outside
    it are left out.
    """
    clients: dict[str, set[str]] = {}
    device: str | None = None
    for line in text.splitlines():
        header = _DEVICE_LINE.match(line)
        if header:
            index = int(header.group(1))
            device = gpu_uuids[index] if index < len(gpu_uuids) else None
            if device is not None:
                clients.setdefault(device, set())
            continue
        client = _CLIENT_LINE.fullmatch(line.strip())
        if client and device is not None:
            clients[device].add(client.group(1))
    return {uuid: len(pids) for uuid, pids in clients.items()}


def mps_status(
    pipe_dir: str | os.PathLike[str],
    control: str | None = None,
    timeout_s: float = 5.0,
    base_env: Mapping[str, str] | None = None,
    gpu_uuids: Sequence[str] = (),
) -> MpsStatus:
    """Ask the daemon on ``pipe_dir`` for its servers and their clients. Never raises.

    Servers exist only while clients use MPS, so an idle healthy daemon
    answers with no servers. ``gpu_uuids``: the daemon's CUDA_VISIBLE_DEVICES,
    in order, to tell clients per GPU.
    """
    try:
        binary = resolve_control(control)
    except LaunchError as e:
        return MpsStatus(answering=False, daemon_pid=None, error=str(e))
    pipe_dir = Path(pipe_dir)
    env = control_env(pipe_dir, base_env=base_env)
    daemon = _daemon_from_pid_file(pipe_dir, binary)
    listing = run_control(binary, ["get_server_list"], env, timeout_s)
    if listing.returncode != 0:
        return MpsStatus(False, daemon.pid if daemon else None, error=listing.output)
    server_pids = _pids(listing.output)
    servers = []
    for pid in server_pids:
        clients = run_control(binary, [f"get_client_list {pid}"], env, timeout_s)
        servers.append(MpsServer(pid, _pids(clients.output) if clients.returncode == 0 else ()))
    devices = run_control(binary, ["get_device_client_list"], env, timeout_s)
    return MpsStatus(
        answering=True,
        daemon_pid=daemon.pid if daemon else None,
        servers=tuple(servers),
        device_clients=devices.output if devices.returncode == 0 else None,
        clients_per_gpu=parse_device_clients(devices.output, gpu_uuids) if devices.returncode == 0 else {},
    )


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


def _daemon_from_pid_file(pipe_dir: Path, control: str) -> psutil.Process | None:
    try:
        proc = psutil.Process(int((pipe_dir / PID_FILE).read_text().strip()))
    except (OSError, ValueError, psutil.Error):
        return None
    return proc if _serves(proc, pipe_dir, (Path(control).name,)) else None


def validate_pinned_limit(value: str) -> str:
    """``set_default_device_pinned_mem_limit`` takes an integer followed by M or G (``config``'s rule)."""
    problem = pinned_limit_problem(value)
    if problem is not None:
        raise PlanError(f"runtime.mps_pinned_device_mem_limit {problem}")
    return value


def clients_per_gpu(plan: LaunchPlan) -> dict[str, int]:
    """How many ranks (each one MPS client) this node's plan puts on each GPU."""
    counts: dict[str, int] = dict.fromkeys(plan.mps.gpu_uuids if plan.mps else (), 0)
    for rank in plan.ranks:
        if rank.gpu_uuid is not None:
            counts[rank.gpu_uuid] = counts.get(rank.gpu_uuid, 0) + 1
    return counts


def check_client_limit(plan: LaunchPlan) -> dict[str, int]:
    """Raise PlanError when a GPU would get more clients than runtime.mps_max_clients_per_gpu."""
    counts = clients_per_gpu(plan)
    limit = plan.mps.max_clients_per_gpu if plan.mps else None
    if limit is None:
        return counts
    over = {uuid: n for uuid, n in counts.items() if n > limit}
    problem = procs_per_gpu_problem(max(over.values()), True, limit) if over else None
    if problem is not None:
        listed = ", ".join(f"{uuid}: {n}" for uuid, n in over.items())
        raise PlanError(
            f"runtime.mps_max_clients_per_gpu is {limit} but the plan puts more ranks on these GPUs "
            f"({listed}): {problem}"
        )
    return counts


class MpsDaemon:
    """One private MPS control daemon for this job.

    ``start()`` returns the variables workers need; ``stop()`` quits, reaps and
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
        return self.run_dir / "pipe"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "log"

    @property
    def pid(self) -> int | None:
        """The control daemon's pid once it answers (None if it could not be identified)."""
        return self._daemon.pid if self._daemon else None

    def worker_env(self) -> dict[str, str]:
        """What every worker adds to its environment to become an MPS client of this daemon."""
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

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

    def start(self) -> dict[str, str]:
        """Start the daemon, wait until it answers, apply the limits; return ``worker_env()``.

        Raises LaunchError (with the daemon's log tail) and leaves nothing behind on failure.
        """
        if self._started or self._stopped:
            raise LaunchError("an MpsDaemon starts once; create a new one to start another daemon")
        self._check_settings()
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
            hint = "" if _FIX_HINT in str(e) else _FIX_HINT  # once, even when the cause already gave it
            raise LaunchError(f"{e}\n{tail}{hint}") from None
        except BaseException:
            self.stop()
            raise
        return self.worker_env()

    def _check_settings(self) -> None:
        pct = self.mps.active_thread_percentage
        problem = active_thread_percentage_problem(pct) if pct is not None else None
        if problem is not None:
            raise PlanError(f"runtime.mps_active_thread_percentage: {problem}")
        if self.mps.pinned_device_mem_limit is not None:
            validate_pinned_limit(self.mps.pinned_device_mem_limit)

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
        owner = _daemon_from_pid_file(self.pipe_dir, self._binary)
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
        _reap_zombie_children(Path(self._binary).name)

    def _find_daemon(self) -> psutil.Process | None:
        assert self._binary is not None
        by_file = _daemon_from_pid_file(self.pipe_dir, self._binary)
        if by_file is not None:
            return by_file
        found = find_mps_processes(self.pipe_dir, (Path(self._binary).name,))
        return min(found, key=lambda p: p.create_time()) if found else None

    def _apply_limits(self) -> None:
        """Set the configured defaults; they apply to servers started after this, i.e. for our workers."""
        commands: list[tuple[str, str]] = []
        if self.mps.active_thread_percentage is not None:
            commands.append(
                (
                    f"set_default_active_thread_percentage {self.mps.active_thread_percentage}",
                    "get_default_active_thread_percentage",
                )
            )
        if self.mps.pinned_device_mem_limit is not None:
            # Device ordinals as the daemon sees them: CUDA_VISIBLE_DEVICES renumbers the planned GPUs 0..n-1.
            for dev in range(len(self.mps.gpu_uuids)):
                commands.append(
                    (
                        f"set_default_device_pinned_mem_limit {dev} {self.mps.pinned_device_mem_limit}",
                        f"get_default_device_pinned_mem_limit {dev}",
                    )
                )
        for set_cmd, get_cmd in commands:
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
        procs = _wait_gone(procs, deadline)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)  # psutil refuses if the pid was reused
        _wait_gone(procs, time.monotonic() + 5.0)
        _reap_zombie_children(Path(self._binary).name)

    def _owned_processes(self) -> list[psutil.Process]:
        procs = find_mps_processes(self.pipe_dir, (Path(self._binary or CONTROL_BINARY).name, SERVER_BINARY))
        if self._daemon is not None and all(p.pid != self._daemon.pid for p in procs):
            procs.append(self._daemon)  # may already be a zombie: still ours to reap
        return procs


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


def _reap_zombie_children(binary_name: str) -> None:
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


def _wait_gone(procs: list[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Poll until every process is gone or the deadline passes; return those still there."""
    left = [p for p in procs if not _gone(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if not _gone(p)]
    return left


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
