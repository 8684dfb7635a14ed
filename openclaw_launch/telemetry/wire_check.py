"""The launcher's side of the channel (telemetry/wire.py): a datagram is untrusted input
(docs/hangs-and-metrics.md, "The channel"). Every field is checked against its type and its bound
before it becomes a ``Batch`` or a ``Progress``; anything else is None, never an exception. Apart
from wire.py, which the workers import, since only the launcher decodes.
"""

from __future__ import annotations

import json
from typing import Any

from openclaw_launch.telemetry.wire import (
    MAX_BATCH_STEPS,
    MAX_DATAGRAM_BYTES,
    VERSION,
    Batch,
    LastCollective,
    Progress,
    dump_signal,
)


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


def decode(data: bytes) -> Batch | None:
    """A batch, or None for anything that is not a valid one (a stray or truncated datagram)."""
    item = decode_any(data)
    return item if isinstance(item, Batch) else None


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
