"""The run's facts, decided once per command before the plan is built: its id, its free port and
every path of its private run directory.

Pure: computing a path touches nothing (``job/launch.py`` creates the directory and removes it).
``plan`` and ``run --dry-run`` make the same context as ``run`` except for what only a running
launcher knows, which they show as a placeholder (docs/plan-format.md, "Placeholders").
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import PurePosixPath

from openclaw_launch.errors import PlanError
from openclaw_launch.plan.parallel import PARALLEL_FILE_NAME

#: The launcher's process id, part of the run directory's name (unique per launcher on a host).
PID_PLACEHOLDER = "<pid>"
#: 16 random hex digits a running launcher draws for its statistics channel's name (``telemetry_socket_name``).
NONCE_PLACEHOLDER = "<nonce>"
#: 32 random hex digits a running launcher draws and hands its ranks, prefixed to their datagrams.
TOKEN_PLACEHOLDER = "<token>"
#: The id ``run`` draws (12 hex digits) when neither --run-id nor Slurm gives one (one node only).
RUN_ID_PLACEHOLDER = "<run-id>"
#: The TCP port ``run`` finds free on this host when it starts (a one-node job with no port given).
FREE_PORT_PLACEHOLDER = "<free-port>"
#: Node ranks by arrival (c10d without --node-rank): ``plan`` shows node rank 0's plan, and says
#: that ``run`` takes the rank the rendezvous gives (with RANK, GROUP_RANK, the node's name).
NODE_RANK_PLACEHOLDER = "<arrival>"
#: torchrun's port 0 (``--master-port 0``, ``--rdzv-endpoint HOST:0``, ``--standalone``): the free
#: port above, also where a config gives a port. One node only: other nodes could not know it.
FREE_PORT = 0
#: torchrun's run id; several nodes use it when none is given, since a drawn one differs per node.
MULTI_NODE_RUN_ID = "none"
#: An MPS daemon directory's two parts (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY).
MPS_PIPE_SUBDIR, MPS_LOG_SUBDIR = "pipe", "log"


def attempt_rank_dir(rank: int, attempt: int) -> PurePosixPath:
    """A rank's own directory of one attempt, under the logs and the error files alike:
    ``attempt-N/rank-R`` (torchrun's ``attempt_N/R``), so every attempt's files are kept."""
    return PurePosixPath(f"attempt-{attempt}") / f"rank-{rank}"


@dataclass(frozen=True)
class LogDir:
    """``--log-dir DIR``: what a job keeps after it, under ``DIR/RUNID`` (every node's launcher and
    every attempt alike): each rank's logs of each attempt and, with ``--log-dir`` given, the error
    files (``RunDir.errors_dir``). The one definition of that layout."""

    path: PurePosixPath  # DIR/RUNID

    @classmethod
    def of(cls, log_dir: str, run_id: str) -> LogDir:
        return cls(PurePosixPath(log_dir) / run_id)

    @property
    def errors_dir(self) -> PurePosixPath:
        return self.path / "errors"

    def rank_dir(self, rank: int, attempt: int) -> PurePosixPath:
        """The rank's logs of that attempt."""
        return self.path / attempt_rank_dir(rank, attempt)

    def rank_log(self, rank: int, attempt: int, stream: str) -> PurePosixPath:
        """``stream`` (stdout or stderr) of the rank in that attempt."""
        return self.rank_dir(rank, attempt) / f"{stream}.log"


@dataclass(frozen=True)
class RunDir:
    """One launcher's private directory (mode 0700, removed at the end) and the run's files.

    Error files are kept with the logs when ``--log-dir`` is given (``errors_dir``), otherwise
    they live in the run directory and go with it.
    """

    path: PurePosixPath
    errors_dir: PurePosixPath
    socket: str  # the statistics channel's abstract address (``telemetry_socket_name``)
    # The statistics channel's secret (``wire.TOKEN_ENV``): what the kernel's SCM_CREDENTIALS do not
    # prove to a sender that can forge them (stats/inbox.py says what each defends).
    token: str = TOKEN_PLACEHOLDER

    @property
    def mps_dir(self) -> PurePosixPath:
        """The private MPS daemon's directory (run/mps/daemon.py creates it)."""
        return self.path / "mps"

    @property
    def mps_pipe_dir(self) -> PurePosixPath:
        return self.mps_dir / MPS_PIPE_SUBDIR

    @property
    def mps_log_dir(self) -> PurePosixPath:
        return self.mps_dir / MPS_LOG_SUBDIR

    @property
    def parallel_file(self) -> PurePosixPath:
        """The TP/PP/DP groups JSON the run writes before the ranks start."""
        return self.path / PARALLEL_FILE_NAME

    def error_file(self, rank: int, attempt: int = 0) -> PurePosixPath:
        """The rank's TORCHELASTIC_ERROR_FILE in that attempt: each attempt has its own (torchrun's
        ``attempt_N/``), so a restart keeps the file of the failure that caused it."""
        return self.errors_dir / attempt_rank_dir(rank, attempt) / "error.json"

    def stacks_file(self, rank: int) -> PurePosixPath:
        """Where the rank's faulthandler writes every thread's stack on a hang."""
        return self.path / f"stacks-rank-{rank}.txt"


@dataclass(frozen=True)
class RunContext:
    """What one command decided about its run; ``build_plan`` takes it and asks nothing else."""

    run_id: str
    run_dir: RunDir
    free_master_port: int | None = None  # found free at start: a one-node job's default; None = not known yet
    # node ranks by arrival: the rendezvous gave the node rank, and free_master_port is node rank 0's
    by_arrival: bool = False


def run_id_for(given: str | None, slurm_job_id: str | None, nnodes: int, drawn: str) -> str:
    """``--run-id``, else Slurm's job id, else for several nodes torchrun's ``none`` (every node
    must share the id: it names the logs and TORCHELASTIC_RUN_ID), else ``drawn`` (``run``: a
    random id; ``plan``: ``RUN_ID_PLACEHOLDER``)."""
    if given:
        return given
    if slurm_job_id:
        return slurm_job_id
    return MULTI_NODE_RUN_ID if nnodes > 1 else drawn


def run_context(
    run_id: str,
    tmp_dir: str,
    pid: int | None,
    log_dir: str | None = None,
    free_master_port: int | None = None,
    by_arrival: bool = False,
) -> RunContext:
    """The context of a run with this id. ``pid`` None: not a running launcher (``plan``,
    ``--dry-run``), shown as ``PID_PLACEHOLDER``, with the channel's nonce and token as theirs; a
    running launcher draws those two here (no one can guess its socket's name to take it first, nor
    the token). ``tmp_dir``: the launcher's temporary directory."""
    _check_run_id(run_id)
    shown_pid = PID_PLACEHOLDER if pid is None else str(pid)
    nonce, token = (
        (NONCE_PLACEHOLDER, TOKEN_PLACEHOLDER) if pid is None else (os.urandom(8).hex(), os.urandom(16).hex())
    )
    path = PurePosixPath(tmp_dir) / f"openclaw-{run_id}-{shown_pid}"
    errors = LogDir.of(log_dir, run_id).errors_dir if log_dir else path / "errors"
    run_dir = RunDir(path=path, errors_dir=errors, socket=telemetry_socket_name(run_id, shown_pid, nonce), token=token)
    return RunContext(run_id=run_id, run_dir=run_dir, free_master_port=free_master_port, by_arrival=by_arrival)


#: The run directory's name ``openclaw-RUNID-PID`` (and the log directory's ``RUNID``) must be one
#: file name: at most 255 bytes, no ``/``. Anything shorter runs, whatever TMPDIR is.
MAX_RUN_ID_BYTES = 200


def _check_run_id(run_id: str) -> None:
    size = len(run_id.encode(errors="surrogateescape"))
    if size > MAX_RUN_ID_BYTES or "/" in run_id or "\0" in run_id or run_id in (".", ".."):
        raise PlanError(
            f"--run-id {run_id[:60]!r}{'...' if len(run_id) > 60 else ''}: the run id names a directory "
            f"(openclaw-RUNID-PID under TMPDIR, RUNID under --log-dir), so it must be one file name: "
            f"at most {MAX_RUN_ID_BYTES} bytes ({size} given), without '/'"
        )


#: Run ids longer than this are shortened in the socket's name (its hash keeps it unique).
MAX_SOCKET_RUN_ID_CHARS = 40


def telemetry_socket_name(run_id: str, pid: str, nonce: str) -> str:
    """Where the ranks send their statistics: ``@openclaw-RUNID-PID-NONCE``, a Linux abstract socket
    (``@`` stands for its leading NUL byte, telemetry/wire.py), so no TMPDIR or run id is too long
    for it (a path is limited to 107 bytes) and no worker cleaning TMPDIR can remove it. Each rank
    has its own address under it (``wire.rank_address``). Abstract names have no owner: any local
    user may bind one first, so the launcher's random ``nonce`` makes the name one nobody can know
    before the launcher binds it. A long or unusual run id is shortened to its first characters and
    a hash."""
    shown = run_id
    if len(run_id) > MAX_SOCKET_RUN_ID_CHARS or not run_id.isprintable() or "/" in run_id:
        import hashlib  # only for such a run id: not on every start

        digest = hashlib.sha256(run_id.encode(errors="surrogateescape")).hexdigest()[:16]
        shown = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id[:20]) + "~" + digest
    return f"@openclaw-{shown}-{pid}-{nonce}"


_held_ports: list[socket.socket] = []


def free_port() -> int:
    """A TCP port free on this host, held by this launcher until it exits: a one-node job's
    MASTER_PORT (torchrun's port 0 and ``--standalone``).

    Finding a free port and closing it again leaves a gap before rank 0 binds it, in which another
    launcher may draw the same one (two jobs, one EADDRINUSE). The port stays bound here instead
    (SO_REUSEADDR, never listening, close-on-exec): the kernel gives it to no other bind or connect,
    while rank 0's store, which also sets SO_REUSEADDR, can listen on it, at every restart too.
    """
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("", 0))
    _held_ports.append(held)
    return int(held.getsockname()[1])


def release_port(port: int) -> None:
    """Stop holding a port ``free_port`` gave (a node that did not become node rank 0)."""
    for held in [h for h in _held_ports if h.getsockname()[1] == port]:
        _held_ports.remove(held)
        held.close()
