"""What a failure was, judged from what the launcher sees: the one table of failure classes and the
pure classifier (no I/O; the evidence is gathered by run/failure_policy.py).

Each class says whether restarting the job can help (the cause is outside the script: a node, a
GPU, the fabric) or not (the script fails the same way each time). The table builds the classes'
rows of docs/failures.md (``python -m tools.failure_docs --write``).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from openclaw_launch.run.results import signal_name
from openclaw_launch.safe_read import parse_json


@dataclass(frozen=True)
class FailureClass:
    name: str
    restart_helps: bool  # the cause is outside the script: another attempt (or a requeue) may succeed
    meaning: str  # what the launcher saw, for docs/failures.md


CLASSES: tuple[FailureClass, ...] = (
    FailureClass("gpu-xid", True, "NVML reported an XID (critical GPU error) on the rank's GPU during the attempt"),
    FailureClass(
        "gpu-ecc", True, "NVML reported an uncorrectable (double-bit) ECC error on the rank's GPU during the attempt"
    ),
    FailureClass("node-lost", True, "a node of the job stopped answering (its agent died, its host or link went away)"),
    FailureClass("hang", True, "`--hang-timeout-s` fired: a rank made no step for the timeout (exit 124)"),
    FailureClass(
        "nccl",
        True,
        "NCCL's text in the rank's error file or last stderr lines (`NCCL error`, `ncclSystemError`, "
        "`ncclRemoteError`, `Watchdog caught collective operation timeout`, ...), or torch.distributed's "
        "`DistBackendError` / `DistNetworkError`: a peer or the fabric failed",
    ),
    FailureClass(
        "killed", True, "killed by a signal from outside (SIGKILL without an OOM kill in the cgroup, SIGTERM, ...)"
    ),
    FailureClass(
        "host-oom",
        False,
        "SIGKILL while the `oom_kill` count of the job's cgroup (`memory.events`) rose: the host's memory ran out",
    ),
    FailureClass(
        "cuda-oom", False, "`torch.OutOfMemoryError` in the error file, or `CUDA out of memory` in the rank's output"
    ),
    FailureClass(
        "exception",
        False,
        "a Python exception in the script: its type from the error file (`@record`), else from the "
        "traceback's last line in stderr",
    ),
    FailureClass("crash", False, "a crash signal: SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT"),
    FailureClass("not-started", False, "the command could not be started: not found (127) or not executable (126)"),
    FailureClass("exit", False, "a non-zero exit code and nothing else known"),
    FailureClass(
        "remote",
        False,
        "another node failed first and this node's workers were stopped (that node's report names the class)",
    ),
    FailureClass(
        "reform",
        True,
        "no failure: a node arrived at an elastic job (`--nnodes MIN:MAX`) and every node's workers restarted "
        "into the larger world (docs/elastic.md)",
    ),
)
BY_NAME = {c.name: c for c in CLASSES}

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
FABRIC_TYPES = frozenset(
    {"torch.distributed.DistBackendError", "torch.distributed.DistNetworkError", "DistBackendError", "DistNetworkError"}
)
CUDA_OOM_TYPES = frozenset({"OutOfMemoryError", "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError"})
CUDA_OOM_TEXT = "CUDA out of memory"
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
# the last line of a Python traceback: ``pkg.mod.SomeError: text`` (or the bare type)
_EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning))(?::|$)")


@dataclass(frozen=True)
class GpuEvent:
    """An NVML event on a GPU: ``xid`` (its number in ``code``) or ``ecc`` (uncorrectable)."""

    kind: str
    uuid: str
    code: int = 0


@dataclass(frozen=True)
class Evidence:
    """Everything the launcher saw of one failure."""

    stop: str = "failure"  # the stop's kind (run/participant.StopKind's value: failure, hang, lost, remote) or reform
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


def error_message(error_file: str | None) -> str:
    """The message torch's ``@record`` writes (``{"message": {"message": "Type: text", ...}}``), else the raw text."""
    if not error_file:
        return ""
    try:
        data = parse_json(error_file)
    except ValueError:
        return error_file
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
        return f"{message.get('message') or ''}\n{callstack or ''}"
    return message if isinstance(message, str) else error_file


def exception_type(error_file: str | None, stderr_tail: tuple[str, ...] = ()) -> str | None:
    """The Python exception's type: the error file message's first line, else the last traceback line of stderr."""
    first = error_message(error_file).strip().splitlines()
    candidates = first[:1] if first else []
    if not candidates and any(line.startswith("Traceback (most recent call last)") for line in stderr_tail):
        candidates = [line for line in reversed(stderr_tail) if line and not line.startswith(" ")][:1]
    for line in candidates:
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            return match["type"]
    return None


def classify(e: Evidence, rank: int | None = None, node: str | None = None) -> Failure:
    """The class of one failure, by the strongest evidence first: the stop's own kind, the GPU's
    events, the host's OOM killer, CUDA OOM, NCCL text, a Python exception, the signal, the code."""
    if e.stop in ("hang", "lost", "remote", "reform"):
        name = {"hang": "hang", "lost": "node-lost", "remote": "remote", "reform": "reform"}[e.stop]
        return Failure(name, f"the job's stop: {e.stop}", rank, node)
    for kind in ("xid", "ecc"):
        events = [ev for ev in e.gpu_events if ev.kind == kind]
        if events:
            what = ", ".join(sorted({f"XID {ev.code}" if kind == "xid" else "ECC" for ev in events}))
            return Failure(f"gpu-{kind}", f"NVML: {what} on {events[0].uuid}", rank, node)
    if e.signal == signal.SIGKILL and e.oom_kills > 0:
        return Failure("host-oom", f"SIGKILL with {e.oom_kills} OOM kill(s) in the job's cgroup", rank, node)
    text = "\n".join((error_message(e.error_file), *e.stderr_tail))
    found = exception_type(e.error_file, e.stderr_tail)
    if found in CUDA_OOM_TYPES or CUDA_OOM_TEXT in text:
        return Failure("cuda-oom", found or CUDA_OOM_TEXT, rank, node)
    marker = next((m for m in NCCL_MARKERS if m in text), None)
    if marker is not None or found in FABRIC_TYPES:
        detail = found if marker is None else marker if found is None else f"{found}: {marker}"
        return Failure("nccl", detail or "", rank, node)
    if found is not None:
        return Failure("exception", found, rank, node)
    if e.not_started:
        return Failure("not-started", f"exit code {e.exit_code}", rank, node)
    if e.signal is not None:
        name = signal_name(e.signal)
        return Failure("crash" if e.signal in CRASH_SIGNALS else "killed", name, rank, node)
    return Failure("exit", f"exit code {e.exit_code}", rank, node)


def classes_markdown() -> str:
    """The classes' table of docs/failures.md."""
    rows = ["| class | a restart can help | what the launcher saw |", "|---|---|---|"]
    rows += [f"| `{c.name}` | {'yes' if c.restart_helps else 'no'} | {c.meaning} |" for c in CLASSES]
    return "\n".join(rows) + "\n"
