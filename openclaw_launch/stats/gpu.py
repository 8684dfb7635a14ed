"""NVML samples per GPU, taken by a thread of the statistics helper process (stats/helper.py),
never by the launcher itself (it forks with one thread: run/helper.py).

Every ``interval_s``: utilisation, SM clock, power, temperature, clock-event (throttle) reasons,
memory used, and on GPUs with GPM (Hopper and newer) SM and tensor-pipe activity, which tell real
work from NCCL kernels spinning while they wait. PCIe throughput blocks about 20 ms per call on
H200, so it is read only every ``pcie_every`` samples. Summaries are bounded: sums, minima, maxima.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from openclaw_launch.stats.result import GpuStats

Sample = dict[str, float]

# nvmlClocksEventReason bits that slow a busy GPU down (idle and application clocks do not).
CLOCK_EVENT_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


Event = dict[str, Any]  # an NVML event: {"kind": "xid" | "ecc", "uuid": ..., "code": XID number or 0}
MAX_EVENTS = 64  # kept per job (the first ones: what a failure is classified by)


class SampleSource(Protocol):
    def sample(self, uuid: str, with_pcie: bool) -> Sample | None: ...
    def events(self) -> list[Event]: ...  # XID / uncorrectable ECC events since the last call, never waiting
    def close(self) -> None: ...


class PynvmlSource:
    """Live NVML. GPM samples are kept per GPU so each reading covers the last interval."""

    def __init__(self, uuids: Sequence[str]) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = {u: pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids}
        self._gpm_previous: dict[str, Any] = {}
        self._gpm = {u: self._gpm_supported(h) for u, h in self._handles.items()}
        self._event_set = self._register_events()

    def _register_events(self) -> Any:
        """An NVML event set for XIDs and double-bit ECC errors on every GPU (None: not supported)."""
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception:
            return None
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        for handle in self._handles.values():
            with contextlib.suppress(Exception):  # a GPU without these events, or not permitted
                nvml.nvmlDeviceRegisterEvents(handle, wanted, event_set)
        return event_set

    def events(self) -> list[Event]:
        nvml, out = self._nvml, list[Event]()
        while self._event_set is not None and len(out) < MAX_EVENTS:
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: none pending
                break
            uuid = nvml.nvmlDeviceGetUUID(data.device)
            xid = bool(data.eventType & nvml.nvmlEventTypeXidCriticalError)
            out.append(
                {
                    "kind": "xid" if xid else "ecc",
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    "code": int(data.eventData) if xid else 0,
                }
            )
        return out

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            return bool(self._nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception:
            return False

    def _try(self, sample: Sample, key: str, read: Any) -> None:
        with contextlib.suppress(Exception):  # a counter this GPU or driver does not have
            sample[key] = float(read())

    def sample(self, uuid: str, with_pcie: bool) -> Sample | None:
        nvml, handle = self._nvml, self._handles.get(uuid)
        if handle is None:
            return None
        out: Sample = {}
        self._try(out, "util_pct", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        self._try(out, "sm_clock_mhz", lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        self._try(out, "power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        self._try(out, "temp_c", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
        self._try(out, "memory_used_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        self._try(out, "clock_event_reasons", lambda: reasons(handle))
        if with_pcie:  # KB/s -> MB/s
            self._try(out, "pcie_tx_mbps", lambda: nvml.nvmlDeviceGetPcieThroughput(handle, 0) / 1000.0)
            self._try(out, "pcie_rx_mbps", lambda: nvml.nvmlDeviceGetPcieThroughput(handle, 1) / 1000.0)
        if self._gpm.get(uuid):
            try:
                out.update(self._gpm_activity(uuid, handle))
            except Exception:
                self._gpm[uuid] = False
        return out

    def _gpm_activity(self, uuid: str, handle: Any) -> Sample:
        nvml = self._nvml
        current = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, current)
        previous, self._gpm_previous[uuid] = self._gpm_previous.get(uuid), current
        if previous is None:
            return {}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = previous, current
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        nvml.nvmlGpmMetricsGet(request)
        nvml.nvmlGpmSampleFree(previous)
        return {"sm_activity_pct": request.metrics[0].value, "tensor_activity_pct": request.metrics[1].value}

    def close(self) -> None:
        for sample in self._gpm_previous.values():
            with contextlib.suppress(Exception):
                self._nvml.nvmlGpmSampleFree(sample)
        if self._event_set is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlEventSetFree(self._event_set)
        self._nvml.nvmlShutdown()


class RecordedSource:
    """Samples recorded on a real machine (``{uuid: [sample, ...]}``), replayed in a loop; its
    ``events`` (``[{"kind", "uuid", "code"}]``, an XID the recording saw) are delivered once."""

    def __init__(self, samples: Mapping[str, Sequence[Sample]], events: Sequence[Event] = ()) -> None:
        self._samples = samples
        self._next: dict[str, int] = {}
        self._events = list(events)

    @classmethod
    def load(cls, path: Path) -> RecordedSource:
        data = json.loads(path.read_text())
        return cls(data["samples"], data.get("events", ()))

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def sample(self, uuid: str, with_pcie: bool) -> Sample | None:
        recorded = self._samples.get(uuid)
        if not recorded:
            return None
        index = self._next.get(uuid, 0)
        self._next[uuid] = index + 1
        return dict(recorded[index % len(recorded)])

    def close(self) -> None:
        pass


class GpuSummary:
    """Bounded running summary of one GPU's samples."""

    def __init__(self) -> None:
        self.samples = 0
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._min: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._reasons = 0

    def add(self, sample: Sample) -> None:
        self.samples += 1
        for key, value in sample.items():
            if key == "clock_event_reasons":
                self._reasons |= int(value)
                continue
            self._sums[key] = self._sums.get(key, 0.0) + value
            self._counts[key] = self._counts.get(key, 0) + 1
            self._min[key] = min(self._min.get(key, value), value)
            self._max[key] = max(self._max.get(key, value), value)

    def stats(self) -> GpuStats:
        """The summary as the report holds it: means to 0.01, memory to 0.1 MiB, null where the GPU
        gave no value."""
        from openclaw_launch.stats.result import GpuStats  # in the helper: the launcher starts without it

        return GpuStats(
            samples=self.samples,
            util_pct_mean=self._mean("util_pct"),
            sm_clock_mhz_mean=self._mean("sm_clock_mhz"),
            sm_clock_mhz_min=_float(self._min.get("sm_clock_mhz")),
            power_w_mean=self._mean("power_w"),
            temp_c_max=_float(self._max.get("temp_c")),
            memory_used_mib_max=_float(self._max.get("memory_used_mib"), 1),
            clock_event_reasons=tuple(name for bit, name in CLOCK_EVENT_REASONS.items() if self._reasons & bit),
            pcie_rx_mbps_mean=self._mean("pcie_rx_mbps"),
            pcie_tx_mbps_mean=self._mean("pcie_tx_mbps"),
            sm_activity_pct_mean=self._mean("sm_activity_pct"),
            tensor_activity_pct_mean=self._mean("tensor_activity_pct"),
        )

    def _mean(self, key: str) -> float | None:
        count = self._counts.get(key)
        return round(self._sums[key] / count, 2) if count else None


def _float(value: float | None, digits: int | None = None) -> float | None:
    """A sampled value as a float (a recorded sample may hold an int), rounded to ``digits`` if given."""
    if value is None:
        return None
    return float(value) if digits is None else round(float(value), digits)


class GpuSampler:
    """Samples every GPU of the plan on its own thread until ``stop``; ``on_round`` is called (on that
    thread) after each round of samples."""

    def __init__(
        self,
        source: SampleSource,
        uuids: Sequence[str],
        interval_s: float = 1.0,
        pcie_every: int = 30,
        on_round: Callable[[GpuSampler], None] | None = None,
    ):
        self._source = source
        self._on_round = on_round
        self._uuids = list(uuids)
        self._interval_s = interval_s
        self._pcie_every = pcie_every
        self._summaries = {u: GpuSummary() for u in self._uuids}
        self._latest: dict[str, Sample] = {}  # the last sample per GPU (the live metrics)
        self._events: list[Event] = []  # NVML events, the first MAX_EVENTS of the job
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="openclaw-gpu-sampler", daemon=True)
        self.error: str | None = None

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        tick = 0
        try:
            while True:
                for uuid in self._uuids:
                    sample = self._source.sample(uuid, with_pcie=tick % self._pcie_every == 0)
                    if sample:
                        with self._lock:
                            self._summaries[uuid].add(sample)
                            self._latest[uuid] = {**self._latest.get(uuid, {}), **sample}
                tick += 1
                new = self._source.events()
                with self._lock:
                    self._events += new[: MAX_EVENTS - len(self._events)]
                if self._on_round is not None:
                    self._on_round(self)
                if self._stop.wait(self._interval_s):
                    break
        except Exception as exc:  # NVML went away mid-job: keep what we have, say so in the report
            self.error = f"GPU sampling stopped: {exc!r}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        with contextlib.suppress(Exception):
            self._source.close()

    def latest(self) -> dict[str, Sample]:
        with self._lock:
            return {u: dict(s) for u, s in self._latest.items()}

    def summaries(self) -> dict[str, GpuStats]:
        with self._lock:
            return {u: s.stats() for u, s in self._summaries.items()}

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)
