"""What workers tell the launcher: one definition of the channel, used by both sides.

Workers send JSON datagrams to a Unix socket in the launcher's private run directory.
Datagrams keep message boundaries, a send never blocks (a full queue drops the batch and
the next one says how many were lost) and a launcher that is gone costs the worker one
failed ``sendto``. This module imports only the standard library's ``json``; the launcher's
checked decoding is telemetry/wire_check.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

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
# How often a worker sends its batch of steps while steps happen, in seconds: the plan sets it from
# --stats-interval-s (``flush_interval_s``), the recorder reads it once.
FLUSH_ENV = "OPENCLAW_TELEMETRY_FLUSH_S"
FLUSH_INTERVAL_S = 0.5  # the default live cadence's (and --stats-interval-s 2 s and up's) flush
MIN_FLUSH_INTERVAL_S = 0.05  # at most 20 batches a second per rank, whatever the interval
FLUSH_PER_STATS_INTERVAL = 4  # batches per live interval, at least


def flush_interval_s(stats_interval_s: float | None) -> float:
    """A worker's flush interval for the launcher's --stats-interval-s (None: the default cadence,
    0: no live line): a quarter of the interval, at most FLUSH_INTERVAL_S, at least MIN_FLUSH_INTERVAL_S.

    The live verdict (and --on-straggler exclude) judges each interval on the steps that arrived by
    its tick, so a step waits up to one flush before it counts: a quarter of the interval keeps that
    under 25 % of it (0.125 s at 0.5 s, where 0.5 s was a whole interval). Intervals of 2 s and up and
    the default cadence (10 s and more) keep 0.5 s: the verdict gains nothing and the launcher reads no
    more datagrams. The floor bounds the datagram rate (20/s per rank) for tiny intervals; a batch
    still goes out at MAX_BATCH_STEPS steps, so it stays small either way."""
    if not stats_interval_s:
        return FLUSH_INTERVAL_S
    return max(MIN_FLUSH_INTERVAL_S, min(FLUSH_INTERVAL_S, stats_interval_s / FLUSH_PER_STATS_INTERVAL))


def flush_interval_from_env(value: str | None) -> float:
    """FLUSH_ENV's value as the recorder uses it: FLUSH_INTERVAL_S when unset or not a number the
    plan could have set (a worker started by hand or an older launcher keeps today's flush)."""
    try:
        seconds = float(value or "")
    except ValueError:
        return FLUSH_INTERVAL_S
    return seconds if MIN_FLUSH_INTERVAL_S <= seconds <= FLUSH_INTERVAL_S else FLUSH_INTERVAL_S


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
