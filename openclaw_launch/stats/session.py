"""One job's statistics: the inbox, the collector, the GPU sampler, the live line and the result.

Everything the supervisor calls here is quick and non-blocking (a socket drain, arithmetic on
bounded summaries); NVML runs on the sampler's own thread.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from openclaw_launch.stats import verdict
from openclaw_launch.stats.collect import Collector, RankSummary
from openclaw_launch.stats.inbox import Inbox
from openclaw_launch.telemetry import wire

if TYPE_CHECKING:
    from openclaw_launch.plan.build import LaunchPlan
    from openclaw_launch.stats.gpu import GpuSampler, SampleSource
    from openclaw_launch.stats.hang_monitor import HangMonitor
    from openclaw_launch.stats.metrics import MetricsServer, StatsFile

log = logging.getLogger(__name__)


class StatsSession:
    def __init__(
        self,
        plan: LaunchPlan,
        socket_path: str,
        threshold_pct: float,
        say: Callable[[str], None],
        gpu_source: Callable[[list[str]], SampleSource] | None = None,
    ) -> None:
        self.plan = plan
        self.threshold_pct = threshold_pct
        self._say = say
        self.collector = Collector()
        self.inbox = Inbox(socket_path)
        self.sampler: GpuSampler | None = None
        self.gpu_error: str | None = None
        self.hang: HangMonitor | None = None  # --hang-timeout-s
        self.metrics: MetricsServer | None = None  # --metrics-port
        self.stats_file: StatsFile | None = None  # --stats-file
        self.attempt = 0
        self.states: dict[int, str] = {}  # rank -> worker state for the live metrics
        uuids = sorted({r.gpu_uuid for r in plan.ranks if r.gpu_uuid})
        if uuids and gpu_source is not None:
            from openclaw_launch.stats.gpu import GpuSampler

            try:
                self.sampler = GpuSampler(gpu_source(uuids), uuids).start()
            except Exception as exc:  # no NVML in this container, a driver mismatch: statistics go on
                self.gpu_error = f"GPU sampling off: {exc}"
                say(f"openclaw-launch: warning: {self.gpu_error}")

    # ---- called by the supervisor ----------------------------------------------------------------

    def drain(self) -> None:
        for datagram in self.inbox.receive():
            item = wire.decode_any(datagram)
            if item is None:
                self.collector.bad_datagrams += 1
                continue
            if isinstance(item, wire.Batch):
                self.collector.add(item)
                self.states[item.rank] = "finished" if item.final else "running"
            elif self.states.get(item.rank) != "finished":
                self.states[item.rank] = "running"
            if self.hang is not None:
                self.hang.on_datagram(item)

    def before_attempt(self, attempt: int) -> None:
        self.collector.reset()
        self.attempt = attempt
        self.states = {}
        if self.hang is not None:
            self.hang.before_attempt()

    def hang_tick(self) -> None:
        """Every hang.CHECK_INTERVAL_S while workers run."""
        self.drain()
        if self.hang is not None:
            self.hang.tick()
            if self.hang.verdict is not None:
                self.states.update({h.rank: "hung" for h in self.hang.verdict.stuck})

    def publish(self) -> None:
        """Every metrics.REFRESH_S: the endpoint's numbers."""
        self.drain()
        if self.metrics is not None:
            self.metrics.publish(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        from openclaw_launch.stats.metrics import snapshot

        gpus = self.sampler.latest() if self.sampler is not None else {}
        return snapshot(self.plan, self.attempt, self.collector.summaries(), self.states, gpus)

    def live_line(self) -> None:
        """The one-line summary printed every --stats-interval-s (and a line of --stats-file)."""
        self.drain()
        if self.stats_file is not None:
            self.stats_file.append(self.snapshot())
        window = self.collector.window()
        if not window:
            return
        self._say("openclaw-launch: stats: " + self._line(window, self.collector.summaries()))

    def _line(self, window: list[RankSummary], total: list[RankSummary]) -> str:
        steps = sum(r.steps for r in total)
        measured = [r for r in window if r.measured_steps]
        if not measured:
            return f"{len(total)} rank(s), {steps} steps so far"
        p50 = statistics.median(r.step_p50_s for r in measured)
        text = f"{len(total)} rank(s), {steps} steps, step p50 {1000 * p50:.1f} ms over the last interval"
        found = verdict.find_stragglers(window, self._facts(), self.threshold_pct)
        if found:
            s = found[0]
            text += f"; straggler: rank {s.rank} ({s.phase}, {s.section}) +{s.excess_pct:.0f} %"
        else:
            text += "; no straggler"
        return text

    # ---- at the end ------------------------------------------------------------------------------

    def finish(self, binding_warnings: Mapping[int, str]) -> dict[str, Any]:
        """Stop sampling, read the last batches, judge. Returns the report's statistics part."""
        self.drain()
        if self.stats_file is not None:  # the last line: the job's final numbers
            self.stats_file.append(self.snapshot())
        self.close()
        summaries = self.collector.summaries()
        found = verdict.find_stragglers(summaries, self._facts(binding_warnings), self.threshold_pct)
        bound = verdict.sync_bound(summaries)
        gpus = self.sampler.summaries() if self.sampler is not None else {}
        if found:
            log.info("straggler verdict: %s", [s.to_json() for s in found])
        return {
            "hang": self.hang.to_json() if self.hang is not None else None,
            "summaries": summaries,
            "stragglers": found,
            "sync_bound_share": bound,
            "gpus": gpus,
            "gpu_error": self.gpu_error,
            "threshold_pct": self.threshold_pct,
            "bad_datagrams": self.collector.bad_datagrams,
        }

    def close(self) -> None:
        """Idempotent: the launcher calls it on every path, ``finish`` on the normal one."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.stats_file is not None:
            self.stats_file.close()
            self.stats_file = None
        if self.sampler is not None:
            self.sampler.stop()
            self.gpu_error = self.gpu_error or self.sampler.error
        self.inbox.close()

    def _facts(self, binding_warnings: Mapping[int, str] | None = None) -> dict[int, verdict.RankFacts]:
        gpus = self.sampler.summaries() if self.sampler is not None else {}
        return {
            r.rank: verdict.RankFacts(
                node=r.node,
                gpu=gpus.get(r.gpu_uuid) if r.gpu_uuid else None,
                binding_warning=(binding_warnings or {}).get(r.rank),
            )
            for r in self.plan.ranks
        }
