"""NCCL collective durations from torch's flight recorder (``--telemetry full``), read off the
training thread and attributed to the steps they were issued in: the GPU wait signal of the verdict
(stats/verdict.py), which the CPU cannot see (NCCL only enqueues). Installed by the torch hooks."""

from __future__ import annotations

import bisect
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence

import openclaw_launch.telemetry.wire as wire


def flight_recorder_on() -> bool:
    """Timed entries exist only with a buffer and TORCH_NCCL_ENABLE_TIMING (``--telemetry full``)."""
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    return size.strip().isdigit() and int(size) > 0 and os.environ.get("TORCH_NCCL_ENABLE_TIMING") == "1"


class FlightRecorder:
    """NCCL collective durations (TORCH_NCCL_ENABLE_TIMING) attributed to the steps they were
    issued in. A dump costs time proportional to the buffer (tens of ms for 2000 entries without
    stack traces), so it is read every ``READ_INTERVAL_S`` only, by ``FlightRecorderThread``; a step
    is reported once it ended ``SETTLE_NS`` ago (its collectives are done)."""

    READ_INTERVAL_S = 2.0
    SETTLE_NS = 1_000_000_000

    def __init__(self, dump: Callable[..., bytes]) -> None:
        self._dump = dump  # torch's pickled flight-recorder dump
        self._seen = -1  # highest record_id already counted
        self._last_read = 0.0
        self._open: dict[tuple[int, int], list[float]] = {}  # step window -> [sum, max, count]

    def read(self, windows: Sequence[tuple[int, int]]) -> wire.GpuRead | None:
        now = time.monotonic()
        if now - self._last_read < self.READ_INTERVAL_S or not windows:
            return None
        self._last_read = now
        data = pickle.loads(self._dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))
        starts = [start for start, _ in windows]
        for entry in sorted(data.get("entries", ()), key=lambda e: e.get("record_id", -1)):
            record_id = entry.get("record_id", -1)
            if record_id <= self._seen:
                continue
            duration, created = entry.get("duration_ms"), entry.get("time_created_ns")
            if duration is None and entry.get("state") != "completed":
                break  # not finished yet: count it (and what follows) next time
            self._seen = record_id
            index = bisect.bisect_right(starts, created or 0) - 1
            if duration is None or index < 0 or created >= windows[index][1]:
                continue  # outside any step we know (before the first, or buffer wrapped)
            acc = self._open.setdefault(windows[index], [0.0, 0.0, 0.0])
            acc[0] += duration / 1000.0
            acc[1] = max(acc[1], duration / 1000.0)
            acc[2] += 1
        cutoff = time.time_ns() - self.SETTLE_NS
        done = [w for w in self._open if w[1] <= cutoff]
        if not done:
            return None
        finished = [self._open.pop(w) for w in done]
        return wire.GpuRead(
            steps=len(finished),
            sync_s=sum(a[0] for a in finished),
            late_s=sum(a[1] for a in finished),
            collectives=int(sum(a[2] for a in finished)),
        )


class FlightRecorderThread:
    """Reads the flight recorder off the training thread. A GPU training loop spends most of its
    time in CUDA waits that release the GIL, so the dump's cost overlaps the step instead of
    adding to it. ``take`` (called at a flush) returns what was read since the last call."""

    def __init__(self, reader: FlightRecorder, windows: Sequence[tuple[int, int]]) -> None:
        self._reader = reader
        self._windows = windows
        self._lock = threading.Lock()
        self._pending: wire.GpuRead | None = None
        self._thread = threading.Thread(target=self._run, name="openclaw-flight-recorder", daemon=True)

    def start(self) -> FlightRecorderThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            time.sleep(self._reader.READ_INTERVAL_S)
            try:
                read = self._reader.read(list(self._windows))
            except Exception:  # torch-internal format changed: no GPU wait signal, the job goes on
                return
            if read is not None:
                with self._lock:
                    old = self._pending
                    self._pending = read if old is None else _added(old, read)

    def take(self, _windows: Sequence[tuple[int, int]]) -> wire.GpuRead | None:
        with self._lock:
            read, self._pending = self._pending, None
        return read


def _added(a: wire.GpuRead, b: wire.GpuRead) -> wire.GpuRead:
    return wire.GpuRead(a.steps + b.steps, a.sync_s + b.sync_s, a.late_s + b.late_s, a.collectives + b.collectives)
