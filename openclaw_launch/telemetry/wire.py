"""What workers tell the launcher: one definition of the channel, used by both sides.

Workers send JSON datagrams to a Unix socket in the launcher's private run directory.
Datagrams keep message boundaries, a send never blocks (a full queue drops the batch and
the next one says how many were lost) and a launcher that is gone costs the worker one
failed ``sendto``. This module imports only the standard library's ``json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SOCKET_ENV = "OPENCLAW_TELEMETRY_SOCKET"  # where to send; unset = telemetry off (the API is a no-op)
HOOKS_ENV = "OPENCLAW_TELEMETRY_HOOKS"  # "0" = no zero-code torch hooks, only the API
# The rank's socket (``rank_address``): its local rank as the launcher planned it. Not LOCAL_RANK,
# which --virtual-local-rank sets to 0 on every rank (they all sent to local rank 0's socket).
SLOT_ENV = "OPENCLAW_TELEMETRY_SLOT"
# The launcher's secret for the channel, put in front of every datagram (stats/inbox.py): the kernel's
# SCM_CREDENTIALS name the sender, but a process with CAP_SYS_ADMIN may forge them.
TOKEN_ENV = "OPENCLAW_TELEMETRY_TOKEN"
# Hang detection (--hang-timeout-s): PROGRESS_ENV = seconds between progress datagrams (what a rank
# is doing now); STACKS_ENV = a file per rank where the bootstrap's faulthandler writes every
# thread's stack when the launcher sends DUMP_SIGNAL.
PROGRESS_ENV = "OPENCLAW_PROGRESS_INTERVAL_S"
STACKS_ENV = "OPENCLAW_STACKS_FILE"
PROGRESS_INTERVAL_S = 0.5  # PROGRESS_ENV's value: how often a worker's progress thread looks for news
# --telemetry levels: full = hooks + NCCL's flight recorder (the GPU wait signal), hooks = zero-code
# hooks only, api = only telemetry.step()/section(), off = no statistics at all.
TELEMETRY_MODES = ("full", "hooks", "api", "off")
VERSION = 1
MAX_DATAGRAM_BYTES = 60_000  # far below the AF_UNIX limit; a batch is flushed before it gets there
MAX_BATCH_STEPS = 200  # a batch goes out when it holds this many steps (keeps datagrams small)

# Phase names with a fixed meaning. Explicit sections may use any other name too.
INPUT = "input"  # waiting for the next batch: DataLoader iteration, or section("data"/"input")
FORWARD = "forward"  # DistributedDataParallel.forward
BACKWARD = "backward"  # Tensor.backward (under DDP it contains the gradient all-reduce wait)
OPTIMIZER = "optimizer"  # optimizer.step()
COLLECTIVE = "collective"  # torch.distributed collectives called from Python, and waits on their Work
P2P = "p2p"  # point-to-point calls (send/recv, isend/irecv, batch_isend_irecv: the pipeline's) and their waits
SYNC = "sync"  # section("sync")
RENDEZVOUS = "rendezvous"  # init_process_group: waiting for the other ranks to join (hang detection)
# The loop's own code before the step's first work phase (in-loop batches, copies, logging), between a
# forward and the next work phase (nanoGPT fetches the next batch there), and after a backward when a
# forward or a fetch comes next (the next micro-batch of gradient accumulation).
HOST = "host"
DEVICE_WAIT = "device-wait"  # host waiting for the GPU (synchronize, .item(), copies to host)
SECTION_ALIASES = {"data": INPUT, "input": INPUT}


@dataclass(frozen=True)
class GpuRead:
    """What one read of the flight recorder found, over ``steps`` finished steps."""

    steps: int
    sync_s: float
    late_s: float
    collectives: int


@dataclass
class Batch:
    """Steps one rank finished since its previous batch.

    ``steps``: (step time, {phase: seconds}) per step, phases exclusive (nested time belongs to
    the innermost phase). ``sync_phases``: the phases that contain waiting for peers.
    From NCCL's flight recorder, over ``gpu_steps`` steps (not necessarily these; it is read less
    often): ``gpu_sync_s`` the time in collectives, ``gpu_late_s`` the sum over steps of the
    longest collective of each step (a rank's first bucket waits as long as the last rank is late).
    ``gpu_busy``: (step number, seconds) of the GPU work of sampled steps, timed with CUDA events
    (telemetry/gpu_events.py); a step's sample may come in a later batch than the step.
    ``group_waits``: seconds waited in these steps per process group (telemetry/groups.py's key).
    """

    rank: int
    steps: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    step_source: str = "none"  # "api" (telemetry.step()) or "optimizer" (its step hook)
    sync_phases: tuple[str, ...] = ()
    gpu_steps: int = 0
    gpu_sync_s: float = 0.0
    gpu_late_s: float = 0.0
    gpu_collectives: int = 0
    gpu_busy: list[tuple[int, float]] = field(default_factory=list)
    dropped_batches: int = 0  # batches this rank could not send (launcher busy or gone)
    final: bool = False  # sent at the worker's exit
    # A pipeline stage (torch.distributed.pipelining's schedule on this rank): (its first stage's
    # index, the pipeline's stages, micro-batches per step); None: not a pipeline stage.
    pipeline: tuple[int, int, int] | None = None
    group_waits: dict[str, float] = field(default_factory=dict)


def rank_address(socket_env: str, local_rank: int) -> str:
    """The address the node's rank ``local_rank`` sends to, from ``SOCKET_ENV``: one socket per rank,
    so that a rank that floods its own cannot fill the queue the others send to (the kernel queues a
    few datagrams per socket). By local rank, which a node's workers keep when an elastic job re-forms
    its world (their global ranks change). A leading ``@`` is a Linux abstract socket's NUL byte (no
    file, no path limit)."""
    name = f"{socket_env}.{local_rank}"
    return "\0" + name[1:] if name.startswith("@") else name


def dump_signal() -> int:
    """The signal that makes a worker's faulthandler write its stacks: SIGRTMIN+7. Not SIGUSR1/2
    (forwarded to workers for checkpoints), not SIGQUIT/SIGTERM (they stop a job), not one glibc or
    common libraries use (SIGRTMIN+0..2 are taken by threading/timer implementations)."""
    import signal

    return int(signal.SIGRTMIN) + 7


@dataclass(frozen=True)
class LastCollective:
    """From torch's flight recorder: the newest collective a rank entered in one process group.
    ``seq``: its ``collective_seq_id`` (the same number on every member for the same collective);
    ``done``: it completed on this rank (NCCL ``completed``, gloo ``retired``)."""

    group: str
    seq: int
    op: str  # "all_reduce", ... (the profiling name without its "nccl:"/"gloo:" prefix)
    done: bool


@dataclass
class Progress:
    """What a rank is doing now, sent by the recorder's progress thread when it changed.

    ``steps``: steps so far (a step ends at each boundary: the boundaries, as the collector counts
    them); ``step_age_s``: seconds since the last one (None before
    the first); ``phase``: the innermost active phase (None: none, i.e. "other"); ``phase_age_s``:
    seconds in it; ``collective``: the last blocking collective called from Python, when known;
    ``dump_signal``: the stack-dump signal the bootstrap registered (None: do not send it);
    ``backend``: the backend of the script's default process group, once it made one;
    ``last_collectives``: with a flight recorder, per process group, read once the rank has not
    stepped for a while; ``gpu``: how far the rank's GPU got, (the newest mark it passed, the newest
    mark the host recorded) as ``gpu_events.position`` numbers (None: no CUDA work seen). Ages, not
    timestamps: the launcher subtracts them from its own clock.
    """

    rank: int
    steps: int
    step_age_s: float | None
    phase: str | None
    phase_age_s: float
    collective: str | None = None
    dump_signal: int | None = None
    backend: str | None = None
    last_collectives: tuple[LastCollective, ...] = ()
    gpu: tuple[int, int] | None = None


def encode_progress(p: Progress) -> bytes:
    return json.dumps(
        {
            "v": VERSION,
            "kind": "progress",
            "rank": p.rank,
            "steps": p.steps,
            "step_age_s": None if p.step_age_s is None else round(p.step_age_s, 4),
            "phase": p.phase,
            "phase_age_s": round(p.phase_age_s, 4),
            "collective": p.collective,
            "dump_signal": p.dump_signal,
            "backend": p.backend,
            "last": [[c.group, c.seq, c.op, c.done] for c in p.last_collectives],
            "gpu": None if p.gpu is None else list(p.gpu),
        },
        separators=(",", ":"),
    ).encode()


def decode_any(data: bytes) -> Batch | Progress | None:
    """A batch or a progress datagram, checked (``_Reader``); None for anything else."""
    try:
        raw = _load(data)
        kind = raw.get("kind")
        if kind == "progress":
            return _progress(_Reader(raw, _PROGRESS_KEYS))
        if kind is None:
            return _batch(_Reader(raw, _BATCH_KEYS))
    except _Invalid:
        pass
    return None


def encode(batch: Batch) -> bytes:
    return json.dumps(
        {
            "v": VERSION,
            "rank": batch.rank,
            "steps": [[round(s, 7), {k: round(v, 7) for k, v in p.items()}] for s, p in batch.steps],
            "step_source": batch.step_source,
            "sync_phases": list(batch.sync_phases),
            "gpu_steps": batch.gpu_steps,
            "gpu_sync_s": round(batch.gpu_sync_s, 7),
            "gpu_late_s": round(batch.gpu_late_s, 7),
            "gpu_collectives": batch.gpu_collectives,
            "gpu_busy": [[step, round(s, 7)] for step, s in batch.gpu_busy],
            "dropped": batch.dropped_batches,
            "final": batch.final,
            **({"pp": list(batch.pipeline)} if batch.pipeline is not None else {}),
            **({"gw": {k: round(v, 7) for k, v in batch.group_waits.items()}} if batch.group_waits else {}),
        },
        separators=(",", ":"),
    ).encode()


def decode(data: bytes) -> Batch | None:
    """A batch, or None for anything that is not a valid one (a stray or truncated datagram)."""
    item = decode_any(data)
    return item if isinstance(item, Batch) else None


# ---- the check: a datagram is untrusted input (docs/hangs-and-metrics.md, "The channel") ---------

MAX_PHASES = 64  # distinct phase names in one step, and in sync_phases
MAX_NAME_CHARS = 200  # a phase or collective name (printable)
MAX_SECONDS = 7 * 86400.0  # a step, a phase, an age: a week is already not a step
MAX_COUNT = 1 << 40  # steps, collectives, dropped batches
_PROGRESS_KEYS = frozenset(
    {"v", "kind", "rank", "steps", "step_age_s", "phase", "phase_age_s", "collective", "dump_signal"}
    | {"backend", "last", "gpu"}
)
MAX_GROUPS = 64  # process groups in a progress datagram's "last"
_BATCH_KEYS = frozenset(
    {"v", "rank", "steps", "step_source", "sync_phases", "gpu_steps", "gpu_sync_s", "gpu_late_s"}
    | {"gpu_collectives", "gpu_busy", "dropped", "final", "pp", "gw"}
)
STEP_SOURCES = ("none", "api", "optimizer")


class _Invalid(ValueError):
    pass


def _reject(constant: str) -> None:
    raise _Invalid(f"not a finite number: {constant}")


def _load(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_DATAGRAM_BYTES:
        raise _Invalid("too large")
    try:  # NaN/Infinity are refused here, 1e999 (inf by float()) in _Reader.seconds
        raw = json.loads(data, parse_constant=_reject)
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise _Invalid(str(exc)) from None
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        raise _Invalid("not a datagram of this version")
    return raw


class _Reader:
    """Typed, bounded reads of one datagram's keys; any unknown key or bad value: ``_Invalid``."""

    def __init__(self, raw: dict[str, Any], keys: frozenset[str]) -> None:
        if not set(raw) <= keys:
            raise _Invalid("unknown keys")
        self.raw = raw

    def count(self, key: str, default: int | None = None) -> int:
        return _count(key, self.raw.get(key, default))

    def seconds(self, key: str, default: float | None = None) -> float:
        return _seconds(key, self.raw.get(key, default))

    def optional_seconds(self, key: str) -> float | None:
        value = self.raw.get(key)
        return None if value is None else _seconds(key, value)

    def optional_positions(self, key: str) -> tuple[int, int] | None:
        """Two GPU positions (``gpu_events.position``): counts, or -1 (before step 0's first mark)."""
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != 2:
            raise _Invalid(f"{key}: not two positions")
        done, recorded = (-1 if v == -1 else _count(key, v) for v in value)
        return done, recorded

    def optional_name(self, key: str) -> str | None:
        value = self.raw.get(key)
        return None if value is None else _name(key, value)


def _count(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise _Invalid(f"{key}: not a count")
    return value


def _seconds(key: str, value: Any) -> float:
    kind = type(value)  # exact types: a bool is no number here
    if (kind is float or kind is int) and 0.0 <= value <= MAX_SECONDS:  # NaN and inf fail the comparison
        return float(value)
    raise _Invalid(f"{key}: not a duration")


_NAMES_SEEN: set[str] = set()  # names already checked (phases repeat every step); bounded
_MAX_NAMES_SEEN = 4096


def _name(key: str, value: Any) -> str:
    if type(value) is not str:
        raise _Invalid(f"{key}: not a name")
    if value in _NAMES_SEEN:
        return value
    if not 0 < len(value) <= MAX_NAME_CHARS or not value.isprintable():
        raise _Invalid(f"{key}: not a name")
    if len(_NAMES_SEEN) < _MAX_NAMES_SEEN:
        _NAMES_SEEN.add(value)
    return value


def _progress(r: _Reader) -> Progress:
    sig = r.raw.get("dump_signal")
    if sig is not None and (isinstance(sig, bool) or sig != dump_signal()):
        raise _Invalid("dump_signal: not the launcher's")
    return Progress(
        rank=r.count("rank"),
        steps=r.count("steps"),
        step_age_s=r.optional_seconds("step_age_s"),
        phase=r.optional_name("phase"),
        phase_age_s=r.seconds("phase_age_s", 0.0),
        collective=r.optional_name("collective"),
        dump_signal=sig,
        backend=r.optional_name("backend"),
        last_collectives=_last_collectives(r),
        gpu=r.optional_positions("gpu"),
    )


def _last_collectives(r: _Reader) -> tuple[LastCollective, ...]:
    raw = r.raw.get("last") or []
    if not isinstance(raw, list) or len(raw) > MAX_GROUPS:
        raise _Invalid("last: not a short list")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 4 or not isinstance(item[3], bool):
            raise _Invalid("last: not [group, seq, op, done]")
        out.append(LastCollective(_name("last", item[0]), _count("last", item[1]), _name("last", item[2]), item[3]))
    return tuple(out)


def _batch(r: _Reader) -> Batch:
    steps_raw, sync_raw = r.raw.get("steps"), r.raw.get("sync_phases", [])
    if not isinstance(steps_raw, list) or len(steps_raw) > MAX_BATCH_STEPS:
        raise _Invalid("steps: not a list of at most MAX_BATCH_STEPS")
    if not isinstance(sync_raw, list) or len(sync_raw) > MAX_PHASES:
        raise _Invalid("sync_phases: not a short list")
    steps: list[tuple[float, dict[str, float]]] = []
    for item in steps_raw:
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], dict) or len(item[1]) > MAX_PHASES:
            raise _Invalid("steps: not [seconds, {phase: seconds}]")
        phases = {_name("phase", k): _seconds("phase", v) for k, v in item[1].items()}
        steps.append((_seconds("step", item[0]), phases))
    source = r.raw.get("step_source", "none")
    final = r.raw.get("final", False)
    if source not in STEP_SOURCES or not isinstance(final, bool):
        raise _Invalid("step_source or final")
    return Batch(
        rank=r.count("rank"),
        steps=steps,
        step_source=source,
        sync_phases=tuple(_name("sync_phases", p) for p in sync_raw),
        gpu_steps=r.count("gpu_steps", 0),
        gpu_sync_s=r.seconds("gpu_sync_s", 0.0),
        gpu_late_s=r.seconds("gpu_late_s", 0.0),
        gpu_collectives=r.count("gpu_collectives", 0),
        gpu_busy=_gpu_busy(r),
        dropped_batches=r.count("dropped", 0),
        final=final,
        pipeline=_pipeline(r),
        group_waits=_group_waits(r.raw.get("gw", {})),
    )


def _group_waits(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict) or len(raw) > MAX_GROUPS:
        raise _Invalid("gw: not {group: seconds} of at most MAX_GROUPS")
    return {_name("gw", k): _seconds("gw", v) for k, v in raw.items()}


def _pipeline(r: _Reader) -> tuple[int, int, int] | None:
    raw = r.raw.get("pp")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != 3:
        raise _Invalid("pp: not [stage, stages, micro-batches]")
    stage, stages, micro = (_count("pp", v) for v in raw)
    if stage >= stages:
        raise _Invalid("pp: stage beyond the stages")
    return stage, stages, micro


def _gpu_busy(r: _Reader) -> list[tuple[int, float]]:
    raw = r.raw.get("gpu_busy", [])
    if not isinstance(raw, list) or len(raw) > MAX_BATCH_STEPS:
        raise _Invalid("gpu_busy: not a list of at most MAX_BATCH_STEPS")
    if not all(isinstance(item, list) and len(item) == 2 for item in raw):
        raise _Invalid("gpu_busy: not [step, seconds]")
    return [(_count("gpu_busy", step), _seconds("gpu_busy", seconds)) for step, seconds in raw]
