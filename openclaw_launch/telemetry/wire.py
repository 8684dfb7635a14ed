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
