"""One job's statistics: the inbox, the collector, the live line and the result; NVML sampling,
the metrics endpoint and the stats file run in the statistics helper process (stats/helper.py).

Everything the supervisor calls here is quick and non-blocking (a socket drain, arithmetic on
bounded summaries, a line to the helper); the launcher itself runs no thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from openclaw_launch.config import defaults
from openclaw_launch.run.participant import Participant, Timer
from openclaw_launch.stats import groups
from openclaw_launch.stats.collect import Collector, RankSummary
from openclaw_launch.stats.imbalance import StepAlignment
from openclaw_launch.stats.inbox import Inbox
from openclaw_launch.telemetry import wire, wire_check

if TYPE_CHECKING:
    from openclaw_launch.plan.model import LaunchPlan, RankPlan
    from openclaw_launch.run.failure_class import GpuEvent
    from openclaw_launch.stats import verdict
    from openclaw_launch.stats.gpu import SampleSource
    from openclaw_launch.stats.hang_monitor import HangMonitor
    from openclaw_launch.stats.helper import StatsHelper
    from openclaw_launch.stats.job_live import JobLiveTarget
    from openclaw_launch.stats.judged import Judged
    from openclaw_launch.stats.result import GpuStats, SessionResult, Straggler


# The live line judges an interval only when every rank made this many steps in it (4 of the verdict's
# 5-step windows): a first interval of two windows a rank once named a rank still warming up.
LIVE_MIN_STEPS = 20


class StatsSession(Participant):
    """A supervision participant: its readers (the inbox, the helper's link), its timers (the live
    line, the metrics refresh), a reset per attempt."""

    def __init__(
        self,
        plan: LaunchPlan,
        socket_path: str,
        threshold_pct: float,
        say: Callable[[str], None],
        gpu_source: Callable[[list[str]], SampleSource] | None = None,
        metrics_port: int | None = None,
        stats_file: str | None = None,
        interval_s: float | None = 0.0,
        job_live: JobLiveTarget | None = None,
        job_line: bool = True,
        on_judged: Callable[[Judged], None] | None = None,
    ) -> None:
        """``gpu_source`` (called in the helper), ``metrics_port`` (0: a free one), ``stats_file`` and
        ``job_live`` (a multi-node job's live verdict, stats/job_live.py): the helper's parts; it is
        started only when one of them is asked for. Node 0: ``job_line`` prints the job's line,
        ``on_judged`` gets every interval's verdict."""
        self.plan = plan
        self.threshold_pct = threshold_pct
        self._say = say
        self.collector = Collector(groups.namer(plan.parallel, plan.world_size))  # waits per process group
        self.alignment = StepAlignment(r.rank for r in plan.ranks)  # per-step imbalance (stats/imbalance.py)
        sock = None
        if metrics_port is not None:  # first: a busy port fails before anything exists
            from openclaw_launch.stats.metrics import listen

            sock = listen(metrics_port)
        self.metrics_port: int | None = sock.getsockname()[1] if sock is not None else None  # as bound
        self.inbox = Inbox(socket_path, [(r.local_rank, r.rank) for r in plan.ranks], plan.run_dir.token)
        self.hang: HangMonitor | None = None  # --hang-timeout-s
        self.helper: StatsHelper | None = None
        self.stats_file = stats_file  # --stats-file
        self.interval_s = interval_s  # the live line (and a --stats-file line) this often; 0: none; None: the cadence
        self._first_line_s: float | None = None  # per attempt: the default cadence's first live line (monotonic)
        self._next_line_s = 0.0
        self.attempt = 0
        self.states: dict[int, str] = {}  # rank -> worker state for the live metrics
        self.exclusions: dict[str, int] = {}  # reason -> nodes an elastic job took out (agents/exclusions.py)
        self.job_live = job_live
        self._world = (plan.node_rank, plan.nnodes) if job_live else (0, 1)  # node rank, nodes (a re-formed world's)
        self._world_attempt = 0  # the job's attempt (a standby or a node taken in later: not this launcher's)
        uuids = sorted({r.gpu_uuid for r in plan.ranks if r.gpu_uuid}) if gpu_source is not None else []
        if uuids or sock is not None or stats_file or job_live is not None:
            from openclaw_launch.stats.helper import StatsHelper

            self.helper = StatsHelper.start(
                uuids,
                gpu_source,
                sock,
                stats_file,
                lambda text: say(f"openclaw-launch: warning: {text}"),
                job_live,
                (lambda text: say(f"openclaw-launch: job stats: {text}")) if job_line else None,
                on_judged,
            )

    @property
    def gpu_error(self) -> str | None:
        return self.helper.gpu_error if self.helper is not None else None

    def readers(self) -> dict[int, Callable[[], None]]:
        """The descriptors the supervisor watches for the session: the inbox, the helper's link."""
        out: dict[int, Callable[[], None]] = {fd: self._reader(fd) for fd in self.inbox.filenos()}
        if self.helper is not None:
            out[self.helper.fileno()] = self.helper.drain
        return out

    # ---- called by the supervisor ----------------------------------------------------------------

    def _reader(self, fd: int) -> Callable[[], None]:
        def take() -> None:
            self._take(fd)

        return take

    def drain(self) -> int:
        """Reads what every rank's socket holds now; returns how many datagrams that was."""
        return sum(self._take(fd) for fd in self.inbox.filenos())

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        """A re-formed world's global ranks: each local rank's socket answers for its new one."""
        self.inbox.assign((r.local_rank, r.rank) for r in ranks)
        self.alignment.expect(r.rank for r in ranks)
        if ranks and self.job_live is not None:
            self._world = (ranks[0].node_rank, int(ranks[0].env.get("GROUP_WORLD_SIZE", self.plan.nnodes)))
            self._world_attempt = int(ranks[0].env.get("TORCHELASTIC_RESTART_COUNT", attempt))

    def on_spawn(self, rank: int, pid: int) -> None:
        """Only this process speaks for the rank in this attempt (stats/inbox.py)."""
        self.inbox.spawned(rank, pid)

    def _take(self, fd: int) -> int:
        """A rank's datagrams: checked (telemetry/wire.py), a bad one counted and dropped."""
        received = self.inbox.receive(fd, time.monotonic())
        for rank, datagram in received:
            item = wire_check.decode_any(datagram)
            if item is None or item.rank != rank:
                self.inbox.invalid(rank)
                continue
            if isinstance(item, wire.Batch):
                self.collector.add(item)
                self.alignment.add(item)
                self.states[item.rank] = "finished" if item.final else "running"
            elif self.states.get(item.rank) != "finished":
                self.states[item.rank] = "running"
            if self.hang is not None:
                self.hang.on_datagram(item)
        for text in self.inbox.warn:
            self._say(f"openclaw-launch: warning: {text}")
        self.inbox.warn.clear()
        return len(received)

    def begin_attempt(self, attempt: int) -> None:
        """Statistics are per attempt: a restart starts from nothing (the hang watch resets itself)."""
        self.collector.reset()
        self.alignment.expect(self.alignment.ranks)
        self.inbox.forget_pids()
        self.attempt = attempt
        self.states = {}
        self._first_line_s, self._next_line_s = None, 0.0  # each attempt's first line within a tick of its steps

    def timers(self) -> list[Timer]:
        from openclaw_launch.stats.metrics import REFRESH_S

        tick_s = self.interval_s if self.interval_s is not None else defaults.LIVE_TICK_S
        out: list[Timer] = [(tick_s, self.live_line)] if tick_s > 0 else []
        if self.metrics_port is not None:
            out.append((REFRESH_S, self.publish))
        return out

    def publish(self) -> None:
        """Every metrics.REFRESH_S: the endpoint's numbers."""
        self.drain()
        if self.helper is not None and self.metrics_port is not None:
            self.helper.publish(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        from openclaw_launch.stats.metrics import snapshot

        gpus = self.helper.latest if self.helper is not None else {}
        states = dict(self.states)
        if self.hang is not None and self.hang.verdict is not None:
            states.update({h.rank: "hung" for h in self.hang.verdict.stuck})
        return {
            **snapshot(self.plan, self.attempt, self.collector.summaries(), states, gpus),
            "exclusions": self.exclusions,
        }

    def count_exclusion(self, reason: str) -> None:
        """A node taken out of the job, for ``openclaw_node_exclusions_total``."""
        self.exclusions[reason] = self.exclusions.get(reason, 0) + 1

    def live_line(self) -> None:
        """The one-line summary printed every --stats-interval-s, or by defaults.LIVE_CADENCE_S (and a
        line of --stats-file)."""
        self.drain()
        now_s = time.monotonic()
        due = self.interval_s is not None or now_s >= self._next_line_s
        self._job_interval(show=due)  # every tick: node 0's job-wide numbers stay within one
        if not due:
            return  # the default cadence: not yet (the window keeps growing until the line)
        if self.helper is not None and self.stats_file:
            self.helper.append(self.snapshot())
        window = self.collector.window()
        if not window:
            return
        self._say("openclaw-launch: stats: " + self._line(window, self.collector.summaries()))
        if self.interval_s is None:  # half a tick early: the timer's own lateness does not skip a line
            self._first_line_s = now_s if self._first_line_s is None else self._first_line_s
            gap_s = defaults.live_gap_s(now_s - self._first_line_s)
            self._next_line_s = now_s + gap_s - defaults.LIVE_TICK_S / 2

    def _job_interval(self, show: bool) -> None:
        """A multi-node job: the ranks' summaries to the helper, which sends them to the agents' store;
        node 0's helper judges every node's (stats/job_live.py), its line printed when ``show``."""
        total = self.collector.summaries() if self.job_live is not None and self.helper is not None else []
        if self.helper is not None and total:
            from openclaw_launch.stats.helper import LiveInterval
            from openclaw_launch.stats.job_live import encode_ranks

            recent = encode_ranks(total)  # the attempt's ranks, their last windows
            live = LiveInterval(self._world_attempt, self.plan.node, *self._world, recent, show)
            self.helper.live_interval(live)  # under the job's attempt: node 0 reads every node's of its world

    def _line(self, window: list[RankSummary], total: list[RankSummary]) -> str:
        steps = sum(r.steps for r in total)
        measured = [r for r in window if r.measured_steps]
        if not measured:
            return f"{len(total)} rank(s), {steps} steps so far"
        import statistics  # here and below: the verdict's imports are not the launcher's start-up time

        from openclaw_launch.stats import verdict
        from openclaw_launch.stats.judged import excess_text

        p50 = statistics.median(r.step_p50_s for r in measured)
        text = f"{len(total)} rank(s), {steps} steps, step p50 {1000 * p50:.1f} ms over the last interval"
        if min(r.measured_steps for r in measured) < LIVE_MIN_STEPS:
            return text + f"; too few steps to judge (fewer than {LIVE_MIN_STEPS} on a rank)"
        found = self._fixed(verdict.find_stragglers(window, self._facts(), self.threshold_pct))
        if found:
            s = found[0]
            text += f"; straggler: rank {s.rank} ({s.phase}, {s.section}) {excess_text(s.excess_pct, s.pct_of)}"
            if any(h.startswith("pipeline:") for h in s.hints):
                text += ", the stage that bounds the pipeline"
        else:
            text += "; no straggler"
        if waits := groups.waits_text(verdict.group_waits(window)):
            text += f"; waits: {waits}"
        from openclaw_launch.stats import imbalance, memory  # findings beyond one slow rank (report too)

        gpus = self._gpu_summaries()
        uneven = memory.find_asymmetry(self.plan.ranks, self.plan.parallel, gpus) if gpus else ()
        return text + imbalance.live_text(self.alignment.judge()) + memory.live_text(uneven)

    def steps_of(self, rank: int) -> int:
        """Steps ``rank`` made in this attempt, with what its socket holds now (the failure policy's)."""
        self.drain()
        return next((s.steps for s in self.collector.summaries() if s.rank == rank), 0)

    def gpu_events(self) -> list[GpuEvent]:
        """Every NVML event (XID, uncorrectable ECC) the helper has delivered so far, oldest first."""
        if self.helper is None:
            return []
        self.helper.drain()
        return self.helper.gpu_events

    # ---- at the end ------------------------------------------------------------------------------

    def finish(self, binding_warnings: Mapping[int, str]) -> SessionResult:
        """Stop sampling, read the last batches, judge. Called once the workers are gone: what they
        sent (a SIGTERM's flush too) is all in the sockets, read to the end so that the counts are
        the ranks' last."""
        while self.drain():
            pass
        if self.helper is not None and self.stats_file:  # the last line: the job's final numbers
            self.helper.append(self.snapshot())
        self.close()
        from openclaw_launch.stats import verdict
        from openclaw_launch.stats.result import SessionResult, StepImbalance

        summaries = self.collector.summaries()
        found = self._fixed(verdict.find_stragglers(summaries, self._facts(binding_warnings), self.threshold_pct))
        if found:
            import logging  # here, at the job's end, not at start-up

            logging.getLogger(__name__).info("straggler verdict: %s", found)
        statistics = verdict.run_statistics(
            summaries,
            self.threshold_pct,
            self.gpu_error,
            self.helper.stats_file_error if self.helper is not None else None,
            {str(rank): d for rank, d in self.inbox.drops().items()},
        )
        return SessionResult(
            statistics=statistics,
            stragglers=tuple(found),
            hang=self.hang.result() if self.hang is not None else None,
            summaries=tuple(summaries),
            gpus=self._gpu_summaries(),
            imbalance=StepImbalance.of(judged) if (judged := self.alignment.judge()) is not None else None,
            recent_steps=self.alignment.recent(),
        )

    def close(self) -> None:
        """Idempotent: the launcher calls it on every path, ``finish`` on the normal one. The helper
        hands over its final GPU summaries, writes what is queued for the stats file, and exits."""
        if self.helper is not None:
            self.helper.finish()
        self.inbox.close()

    def _fixed(self, found: list[Straggler]) -> list[Straggler]:
        """The verdict's stragglers less those the aligned steps show are per-batch variance."""
        from openclaw_launch.stats import verdict

        return verdict.fixed_only(found, self.alignment.judge(), self.threshold_pct)

    def _gpu_summaries(self) -> dict[str, GpuStats]:
        return self.helper.summaries if self.helper is not None else {}

    def _facts(self, binding_warnings: Mapping[int, str] | None = None) -> dict[int, verdict.RankFacts]:
        from openclaw_launch.stats import verdict

        gpus = self._gpu_summaries()
        return {
            r.rank: verdict.RankFacts(
                node=r.node,
                gpu=gpus.get(r.gpu_uuid) if r.gpu_uuid else None,
                binding_warning=(binding_warnings or {}).get(r.rank),
            )
            for r in self.plan.ranks
        }
