"""GPU memory freed before a node takes part again: after a failed attempt of an elastic job, each
of this node's GPUs (NVML, by UUID) must fall back to its used memory before the job, within
``--gpu-memory-timeout-s``; a GPU that does not (an orphaned process, a driver that keeps the
memory) makes the node a failing one (``gpu-memory-held``), taken out of the job like a node with an
XID (agents/exclusions.py, docs/failures.md).

The reading is injected (``MemoryReader``): the live NVML (``NvmlMemory``), or a recording of a real
GPU's samples replayed (``RecordedMemory``; the test hook ``OPENCLAW_TEST_NVML`` names one, and the
statistics helper then replays the same file's samples and NVML events, stats/wiring.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from openclaw_launch.config.defaults import GPU_MEMORY_SLACK_MIB
from openclaw_launch.run.participant import Participant, StopReason

#: Tests only (docs/failures.md): a recorded NVML sample file (``{"samples": {uuid: [sample, ...]},
#: "events": [...]}``, stats/gpu.py's ``RecordedSource`` format) this launcher reads instead of NVML.
NVML_RECORDING_ENV = "OPENCLAW_TEST_NVML"
_POLL_S = 0.2
log = logging.getLogger(__name__)


class MemoryReader(Protocol):
    def used_mib(self, uuids: Sequence[str]) -> dict[str, float]: ...  # a GPU it cannot read is left out


class NvmlMemory:
    """The live NVML's used memory per GPU (in the launcher, between attempts: one thread)."""

    def __init__(self) -> None:
        import pynvml  # lazily: the launcher starts without it

        pynvml.nvmlInit()
        self._nv: Any = pynvml

    def used_mib(self, uuids: Sequence[str]) -> dict[str, float]:
        out = {}
        for uuid in uuids:
            try:
                handle = self._nv.nvmlDeviceGetHandleByUUID(uuid)
                out[uuid] = self._nv.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            except self._nv.NVMLError:
                continue
        return out


class RecordedMemory:
    """A recording's ``memory_used_mib`` per GPU, one sample per reading, then its last one held."""

    def __init__(self, samples: Mapping[str, Sequence[Mapping[str, float]]]) -> None:
        self._samples = {u: [s["memory_used_mib"] for s in seq if "memory_used_mib" in s] for u, seq in samples.items()}
        self._read = dict.fromkeys(self._samples, 0)

    @classmethod
    def load(cls, path: str | Path) -> RecordedMemory:
        return cls(json.loads(Path(path).read_text())["samples"])

    def used_mib(self, uuids: Sequence[str]) -> dict[str, float]:
        out = {}
        for uuid in uuids:
            seq = self._samples.get(uuid)
            if seq:
                out[uuid] = seq[min(self._read[uuid], len(seq) - 1)]
                self._read[uuid] += 1
        return out


def memory_reader(environ: Mapping[str, str]) -> MemoryReader:
    """The recording the test hook names, else the live NVML (raises where there is none: no pynvml,
    no driver)."""
    recording = environ.get(NVML_RECORDING_ENV)
    return RecordedMemory.load(recording) if recording else NvmlMemory()


class GpuMemoryGate(Participant):
    """After an attempt that stopped for a restartable reason, with a restart left: wait until every
    GPU of this node is back to its used memory before the job (plus ``slack_mib``), at most
    ``timeout_s``; ``held[attempt]`` says which GPU was not, and by how much."""

    def __init__(
        self,
        uuids: Sequence[str],
        reader: Callable[[], MemoryReader],
        timeout_s: float,
        max_restarts: int,
        say: Callable[[str], None],
        slack_mib: float = GPU_MEMORY_SLACK_MIB,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.uuids = tuple(dict.fromkeys(uuids))
        self._make_reader = reader
        self._reader: MemoryReader | None = None
        self.timeout_s = timeout_s
        self.max_restarts = max_restarts
        self.say = say
        self.slack_mib = slack_mib
        self._sleep = sleep
        self.before: dict[str, float] = {}  # used MiB per GPU before the job
        self.held: dict[int, str] = {}  # per attempt: the GPUs that kept their memory
        self._attempt = 0
        self._stopped = False

    def begin_attempt(self, attempt: int) -> None:
        self._attempt, self._stopped = attempt, False
        if attempt == 0 and self.uuids:  # before any worker starts: the level to fall back to
            try:
                self._reader = self._make_reader()
                self.before = self._reader.used_mib(self.uuids)
            except Exception as e:  # no NVML here (a CPU host, a snapshot's GPUs): nothing to check
                log.debug("GPU memory check off: %s", e)

    def on_stop(self, reason: StopReason) -> None:
        self._stopped = self._stopped or reason.restartable

    def end_attempt(self, attempt: int) -> None:
        """The attempt's workers and leftovers are gone: its GPUs' memory must follow."""
        if not (self._stopped and self.before and attempt < self.max_restarts):
            return
        held = self._wait()
        if held is not None:
            self.held[attempt] = held
            self.say(f"openclaw-launch: GPU memory not freed after attempt {attempt + 1}: {held}")

    def _wait(self) -> str | None:
        """None once every GPU is back to its level; else, after ``timeout_s``, which are not."""
        assert self._reader is not None
        deadline = time.monotonic() + self.timeout_s
        while True:
            now = self._reader.used_mib(list(self.before))
            over = {u: mib for u, mib in now.items() if mib > self.before[u] + self.slack_mib}
            if not over:
                return None
            if time.monotonic() >= deadline:
                each = "; ".join(
                    f"{u}: {mib:.0f} MiB used, {self.before[u]:.0f} MiB before the job" for u, mib in over.items()
                )
                return f"{each} (not back within {self.timeout_s:g} s, --gpu-memory-timeout-s)"
            self._sleep(_POLL_S)
