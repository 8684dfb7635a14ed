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

# Phase names with a fixed meaning. Explicit sections may use any other name too.
INPUT = "input"  # waiting for the next batch: DataLoader iteration, or section("data"/"input")
FORWARD = "forward"  # DistributedDataParallel.forward
BACKWARD = "backward"  # Tensor.backward (under DDP it contains the gradient all-reduce wait)
OPTIMIZER = "optimizer"  # optimizer.step()
COLLECTIVE = "collective"  # blocking torch.distributed collectives called from Python
SYNC = "sync"  # section("sync")
HOST = "host"  # the rest of the step before its first work phase: in-loop batches, copies, logging
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
    """

    rank: int
    steps: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    step_source: str = "none"  # "api" (telemetry.step()) or "optimizer" (its step hook)
    sync_phases: tuple[str, ...] = ()
    gpu_steps: int = 0
    gpu_sync_s: float = 0.0
    gpu_late_s: float = 0.0
    gpu_collectives: int = 0
    dropped_batches: int = 0  # batches this rank could not send (launcher busy or gone)
    final: bool = False  # sent at the worker's exit


def dump_signal() -> int:
    """The signal that makes a worker's faulthandler write its stacks: SIGRTMIN+7. Not SIGUSR1/2
    (forwarded to workers for checkpoints), not SIGQUIT/SIGTERM (they stop a job), not one glibc or
    common libraries use (SIGRTMIN+0..2 are taken by threading/timer implementations)."""
    import signal

    return int(signal.SIGRTMIN) + 7


@dataclass
class Progress:
    """What a rank is doing now, sent by the recorder's progress thread when it changed.

    ``steps``: step boundaries so far; ``step_age_s``: seconds since the last one (None before
    the first); ``phase``: the innermost active phase (None: none, i.e. "other"); ``phase_age_s``:
    seconds in it; ``collective``: the last blocking collective called from Python, when known;
    ``dump_signal``: the stack-dump signal the bootstrap registered (None: do not send it).
    Ages, not timestamps: the launcher subtracts them from its own clock.
    """

    rank: int
    steps: int
    step_age_s: float | None
    phase: str | None
    phase_age_s: float
    collective: str | None = None
    dump_signal: int | None = None
    pid: int | None = None  # the worker process itself (under numactl: after its exec)


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
            "pid": p.pid,
        },
        separators=(",", ":"),
    ).encode()


def decode_any(data: bytes) -> Batch | Progress | None:
    """A batch or a progress datagram; None for anything else."""
    try:
        raw: Any = json.loads(data)
        if isinstance(raw, dict) and raw.get("v") == VERSION and raw.get("kind") == "progress":
            age = raw.get("step_age_s")
            sig = raw.get("dump_signal")
            phase, coll = raw.get("phase"), raw.get("collective")
            return Progress(
                rank=int(raw["rank"]),
                steps=int(raw["steps"]),
                step_age_s=None if age is None else max(float(age), 0.0),
                phase=None if phase is None else str(phase)[:64],
                phase_age_s=max(float(raw.get("phase_age_s", 0.0)), 0.0),
                collective=None if coll is None else str(coll)[:64],
                dump_signal=None if sig is None else int(sig),
                pid=None if raw.get("pid") is None else int(raw["pid"]),
            )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return decode(data)


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
            "dropped": batch.dropped_batches,
            "final": batch.final,
        },
        separators=(",", ":"),
    ).encode()


def decode(data: bytes) -> Batch | None:
    """A batch, or None for anything that is not one (a stray or truncated datagram)."""
    try:
        raw: Any = json.loads(data)
        if not isinstance(raw, dict) or raw.get("v") != VERSION:
            return None
        steps = [(float(s), {str(k): float(v) for k, v in p.items()}) for s, p in raw["steps"]]
        return Batch(
            rank=int(raw["rank"]),
            steps=steps,
            step_source=str(raw.get("step_source", "none")),
            sync_phases=tuple(str(p) for p in raw.get("sync_phases", ())),
            gpu_steps=int(raw.get("gpu_steps", 0)),
            gpu_sync_s=float(raw.get("gpu_sync_s", 0.0)),
            gpu_late_s=float(raw.get("gpu_late_s", 0.0)),
            gpu_collectives=int(raw.get("gpu_collectives", 0)),
            dropped_batches=int(raw.get("dropped", 0)),
            final=bool(raw.get("final", False)),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
