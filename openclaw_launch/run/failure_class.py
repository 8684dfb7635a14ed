"""What a failure was, judged from what the launcher sees: the one table of failure classes and the
pure classifier (no I/O; the evidence is gathered by run/failure_policy.py).

Each class says what a restart can do: it can help (the cause is outside the script: a node, a GPU,
the fabric), it may help (the script's own failure, its cause unknown: restarted, as torchrun does),
or it cannot help (another attempt fails the same way: not restarted unless ``--restart-any-class``).
The evidence is weighed strongest first: what the kernel, NVML and the process's end say outrank what
the rank printed, and of its output only the exception it died of and its last error lines count
(docs/failures.md). The table builds the classes' rows of docs/failures.md
(``python -m tools.failure_docs --write``).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from openclaw_launch.run.results import signal_name
from openclaw_launch.safe_read import parse_json

#: What a restart can do for a class: the three answers, as the console and docs/failures.md say them.
CAN_HELP = "can help"  # the cause is outside the script (a node, a GPU, the fabric): another attempt may succeed
MAY_HELP = "may help"  # the script's own failure, cause unknown (a flaky start-up, a race): restarted as torchrun
CANNOT_HELP = "cannot help"  # another attempt fails the same way: not restarted unless --restart-any-class


@dataclass(frozen=True)
class FailureClass:
    name: str
    restart: str  # CAN_HELP, MAY_HELP or CANNOT_HELP: what a restart can do (run/failure_policy.py acts on it)
    meaning: str  # what the launcher saw, for docs/failures.md

    @property
    def restart_helps(self) -> bool:
        """The cause is outside the script (``--exit-code-classes``: 75, requeue)."""
        return self.restart == CAN_HELP

    @property
    def words(self) -> str:
        return f"a restart {self.restart}"


CLASSES: tuple[FailureClass, ...] = (
    FailureClass("gpu-xid", CAN_HELP, "NVML reported an XID (critical GPU error) on the rank's GPU during the attempt"),
    FailureClass(
        "gpu-ecc",
        CAN_HELP,
        "NVML reported an uncorrectable (double-bit) ECC error on the rank's GPU during the attempt",
    ),
    FailureClass(
        "node-lost", CAN_HELP, "a node of the job stopped answering (its agent died, its host or link went away)"
    ),
    FailureClass("hang", CAN_HELP, "`--hang-timeout-s` fired: a rank made no step for the timeout (exit 124)"),
    FailureClass(
        "nccl",
        CAN_HELP,
        "NCCL failed: the error file's `DistBackendError` (or torch's C++ `RuntimeError`) naming NCCL "
        "(`NCCL error`, `ncclSystemError`, `ncclRemoteError`, ...), or a SIGABRT whose last error lines are "
        "NCCL's watchdog (`Watchdog caught collective operation timeout`): a peer or the fabric failed",
    ),
    FailureClass(
        "gloo",
        CAN_HELP,
        "gloo failed: the error file's `DistBackendError` or `RuntimeError` naming gloo (`Gloo connectFullMesh "
        "failed`, gloo's `gloo/transport/...` errors such as `Connection closed by peer`): a peer or the network "
        "failed",
    ),
    FailureClass(
        "port-in-use",
        MAY_HELP,
        "torch.distributed could not listen on its port (`EADDRINUSE`, `address already in use`), on any "
        "backend: another process holds MASTER_PORT",
    ),
    FailureClass(
        "fabric",
        CAN_HELP,
        "torch.distributed's `DistNetworkError` or a `DistBackendError` that names no backend (the store's "
        "connection reset or timed out): a peer or the network failed",
    ),
    FailureClass(
        "killed",
        CAN_HELP,
        "killed by a signal from outside (SIGKILL without an OOM kill in the cgroup, SIGTERM, ...), whatever "
        "the rank had printed",
    ),
    FailureClass(
        "host-oom",
        CANNOT_HELP,
        "SIGKILL while the `oom_kill` count of the job's cgroup (`memory.events`) rose: the host's memory ran out",
    ),
    FailureClass(
        "cuda-oom",
        CANNOT_HELP,
        "`torch.OutOfMemoryError` in the error file or as the type of the rank's last traceback (or a "
        "`RuntimeError: CUDA out of memory`, or those words in the last lines before a SIGABRT)",
    ),
    FailureClass(
        "exception",
        MAY_HELP,
        "a Python exception in the script: its type from the error file (`@record`), else from the last "
        "traceback's exception line in stderr",
    ),
    FailureClass("crash", MAY_HELP, "a crash signal: SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT"),
    FailureClass(
        "not-started", CANNOT_HELP, "the command could not be started: not found (127) or not executable (126)"
    ),
    FailureClass("exit", MAY_HELP, "a non-zero exit code and nothing else known"),
    FailureClass(
        "remote",
        MAY_HELP,
        "another node failed first and this node's workers were stopped (that node's report names the class)",
    ),
    FailureClass(
        "reform",
        CAN_HELP,
        "no failure: a node arrived at an elastic job (`--nnodes MIN:MAX`) and every node's workers restarted "
        "into the larger world (docs/elastic.md)",
    ),
    FailureClass(
        "exclude",
        CAN_HELP,
        "no failure: the straggler policy (`--on-straggler exclude`) took the job's straggler node out of an "
        "elastic job and every node's workers restarted into the re-formed world (docs/elastic.md)",
    ),
)
BY_NAME = {c.name: c for c in CLASSES}
#: The classes that name the node, not the script: an elastic job takes a node whose attempt failed so
#: (or that was lost) out for good at the re-forming (agents/exclusions.py, docs/elastic.md).
NODE_CLASSES = frozenset({"gpu-xid", "gpu-ecc", "node-lost", "host-oom"})

NCCL_MARKERS = (
    "NCCL error",
    "ncclSystemError",
    "ncclInternalError",
    "ncclRemoteError",
    "ncclUnhandledCudaError",
    "ncclInvalidUsage",
    "Watchdog caught collective operation timeout",
    "NCCL communicator was aborted",
)
GLOO_MARKERS = ("Gloo connectFullMesh failed", "gloo/transport", "[Gloo]")
PORT_IN_USE_MARKERS = ("EADDRINUSE", "address already in use", "Address already in use")
FABRIC_TYPES = frozenset(
    {"torch.distributed.DistBackendError", "torch.distributed.DistNetworkError", "DistBackendError", "DistNetworkError"}
)
# torch's C++ errors surface as RuntimeError (and, before torch 2.2, NCCL's too): only for these types
# do the exception's own words (never the log's) say what failed
WORDED_TYPES = FABRIC_TYPES | {"RuntimeError", "torch.distributed.DistError", "DistError"}
CUDA_OOM_TYPES = frozenset({"OutOfMemoryError", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"})
CUDA_OOM_TEXT = "CUDA out of memory"
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
#: How many of a rank's last non-empty stderr lines count as its last error lines (a SIGABRT's reason,
#: an exit without a traceback): words on any earlier line are history, not the failure.
LAST_ERROR_LINES = 5
# the last line of a Python traceback: ``pkg.mod.SomeError: text`` (or the bare type)
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::|$)")
_TRACEBACK = "Traceback (most recent call last)"
# torch.distributed's excepthook writes a rank's traceback with ``[rankN]: `` before each line
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")


@dataclass(frozen=True)
class GpuEvent:
    """An NVML event on a GPU: ``xid`` (its number in ``code``) or ``ecc`` (uncorrectable)."""

    kind: str
    uuid: str
    code: int = 0


@dataclass(frozen=True)
class Evidence:
    """Everything the launcher saw of one failure."""

    stop: str = (
        "failure"  # the stop's kind (run/participant.StopKind's value: failure, hang, lost, remote), reform, exclude
    )
    exit_code: int | None = None
    signal: int | None = None
    error_file: str | None = None  # the rank's TORCHELASTIC_ERROR_FILE as written (JSON, or any text)
    stderr_tail: tuple[str, ...] = ()
    oom_kills: int = 0  # OOM kills counted in the job's cgroup during the attempt
    gpu_events: tuple[GpuEvent, ...] = ()  # on the rank's GPU during the attempt
    not_started: bool = False  # the spawn itself failed (126/127)


@dataclass(frozen=True)
class Failure:
    """A classified failure: its class, whose, and the evidence that decided it (one line)."""

    name: str
    detail: str
    rank: int | None = None
    node: str | None = None
    storm: bool = False  # the second of two in a row before any step: the job stopped (run/failure_policy.py)

    @property
    def restart_helps(self) -> bool:
        return BY_NAME[self.name].restart_helps

    @property
    def restart(self) -> str:
        """What a restart can do: CAN_HELP, MAY_HELP or CANNOT_HELP (its class's)."""
        return BY_NAME[self.name].restart


def error_message(error_file: str | None) -> str:
    """The exception torch's ``@record`` writes (``{"message": {"message": "Type: text", ...}}``), else the raw
    text; never the file's call stack (its frames are code, not the failure)."""
    if not error_file:
        return ""
    try:
        data = parse_json(error_file)
    except ValueError:
        return error_file
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        text = message.get("message")
        return text if isinstance(text, str) else ""
    return message if isinstance(message, str) else error_file


@dataclass(frozen=True)
class Raised:
    """The exception a rank died of: its type and its own text (the message, not the log)."""

    type: str
    text: str
    source: str  # "error file" or "traceback"


def _exception_at(lines: list[str], source: str) -> Raised | None:
    """The exception line first in ``lines`` (a traceback's last frame onward) and the lines of its text."""
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "\t")):
            match = _EXCEPTION_LINE.match(line.strip())
            if match is None:
                return None
            rest = [x for x in lines[i + 1 : i + LAST_ERROR_LINES] if x.strip()]
            return Raised(match["type"], "\n".join([line, *rest]), source)
    return None


def raised(error_file: str | None, stderr_tail: tuple[str, ...] = ()) -> Raised | None:
    """The exception a rank died of: the error file's (``@record``), else the last traceback in its stderr;
    an earlier traceback (an error the script caught and logged) is history, not the failure."""
    message = error_message(error_file).strip()
    if message:
        return _exception_at(message.splitlines(), "error file")
    lines = [_RANK_PREFIX.sub("", line, count=1) for line in stderr_tail]
    starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
    if not starts:
        return None
    frames = lines[starts[-1] + 1 :]
    return _exception_at(frames, "traceback")


def exception_type(error_file: str | None, stderr_tail: tuple[str, ...] = ()) -> str | None:
    """The type of the exception a rank died of (``raised``), or None."""
    found = raised(error_file, stderr_tail)
    return found.type if found is not None else None


def last_error_lines(stderr_tail: tuple[str, ...]) -> str:
    """The rank's last LAST_ERROR_LINES non-empty stderr lines, where words may say what failed."""
    lines = [line for line in stderr_tail if line.strip()]
    return "\n".join(lines[-LAST_ERROR_LINES:])


def _by_words(text: str) -> tuple[str, str] | None:
    """(class, marker) by the words in ``text``: CUDA out of memory, a port in use, NCCL's, gloo's."""
    if CUDA_OOM_TEXT in text:
        return "cuda-oom", CUDA_OOM_TEXT
    for name, markers in (("port-in-use", PORT_IN_USE_MARKERS), ("nccl", NCCL_MARKERS), ("gloo", GLOO_MARKERS)):
        marker = next((m for m in markers if m in text), None)
        if marker is not None:
            return name, marker
    return None


def _by_exception(found: Raised, rank: int | None, node: str | None) -> Failure:
    """A Python exception's class: its type decides; its own words only for torch's generic types."""
    if found.type in CUDA_OOM_TYPES:
        return Failure("cuda-oom", found.type, rank, node)
    worded = _by_words(found.text) if found.type in WORDED_TYPES else None
    if worded is not None:
        return Failure(worded[0], f"{found.type}: {worded[1]}", rank, node)
    if found.type in FABRIC_TYPES:
        return Failure("fabric", found.type, rank, node)
    return Failure("exception", found.type, rank, node)


def classify(e: Evidence, rank: int | None = None, node: str | None = None) -> Failure:
    """The class of one failure, by the strongest evidence first: the stop's own kind, the GPU's events,
    the kernel's OOM kill, the signal (nothing the rank printed outranks a SIGKILL or a SIGSEGV), the
    exception it died of (the error file's type, else its last traceback's), then, only without any of
    these, the words of its last error lines (a SIGABRT's reason: NCCL's watchdog), then the exit code."""
    if e.stop in ("hang", "lost", "remote", "reform", "exclude"):
        name = {"hang": "hang", "lost": "node-lost", "remote": "remote", "reform": "reform", "exclude": "exclude"}[
            e.stop
        ]
        return Failure(name, f"the job's stop: {e.stop}", rank, node)
    for kind in ("xid", "ecc"):
        events = [ev for ev in e.gpu_events if ev.kind == kind]
        if events:
            what = ", ".join(sorted({f"XID {ev.code}" if kind == "xid" else "ECC" for ev in events}))
            return Failure(f"gpu-{kind}", f"NVML: {what} on {events[0].uuid}", rank, node)
    if e.signal == signal.SIGKILL and e.oom_kills > 0:
        return Failure("host-oom", f"SIGKILL with {e.oom_kills} OOM kill(s) in the job's cgroup", rank, node)
    if e.signal is not None and e.signal != signal.SIGABRT:  # SIGABRT: C++'s abort, its reason in the last lines
        name = signal_name(e.signal)
        return Failure("crash" if e.signal in CRASH_SIGNALS else "killed", name, rank, node)
    if e.not_started:
        return Failure("not-started", f"exit code {e.exit_code}", rank, node)
    found = raised(e.error_file, e.stderr_tail)
    if found is not None:
        return _by_exception(found, rank, node)
    worded = _by_words("\n".join((error_message(e.error_file), last_error_lines(e.stderr_tail))))
    if worded is not None:
        return Failure(worded[0], worded[1], rank, node)
    if e.signal is not None:
        return Failure("crash", signal_name(e.signal), rank, node)
    return Failure("exit", f"exit code {e.exit_code}", rank, node)
