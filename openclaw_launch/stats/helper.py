"""The statistics helper: a process (run/helper.py) that samples NVML, serves ``--metrics-port`` and
appends ``--stats-file``, so none of their threads runs in the launcher.

The launcher forks it when the session starts (after the guardian, before the first worker) and
does not wait for it: NVML's start (pynvml's import alone is 60-90 ms) runs beside the workers'.
Its messages (``VOCABULARY``, run/helper.py's typed link):

- launcher -> helper: ``Publish`` (the endpoint's snapshot), ``Append`` (a stats-file line),
  ``LiveInterval`` (a multi-node job: this node's interval summaries for the job's live verdict,
  stats/job_live.py), ``Finish`` (stop sampling, write what is queued, answer ``Finished``, exit).
- helper -> launcher: ``GpuRound`` after every round of samples (the latest sample and the running
  summary per GPU, a ``GpuStats`` in the codec's JSON, the NVML events seen so far: XID,
  uncorrectable ECC), ``GpuError`` (NVML did not start), ``StatsFileError`` (the first line that
  could not be written: a full disk), ``JobLine`` (node 0 of a multi-node job: the job's live line),
  ``JobJudged`` (node 0: every interval's verdict, for the straggler policy), ``JobLiveNote`` (any
  node: its connection to the agents' store lost, made again or given up, stats/job_live_store.py;
  said as a warning), ``Finished`` (the final round and errors).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openclaw_launch.run.failure_class import GpuEvent
from openclaw_launch.run.helper import Helper, Link, Message, Vocabulary
from openclaw_launch.stats.judged import Judged

if TYPE_CHECKING:
    from openclaw_launch.stats.gpu import GpuSampler, Sample, SampleSource
    from openclaw_launch.stats.job_live import JobLiveTarget
    from openclaw_launch.stats.result import GpuStats

FINISH_TIMEOUT_S = 12.0  # the sampler's and the file writer's own bounds (5 s each), and a margin


@dataclass(frozen=True)
class Publish(Message):
    snap: dict[str, Any]  # the endpoint's snapshot (stats/metrics.py)


@dataclass(frozen=True)
class Append(Message):
    snap: dict[str, Any]  # one line of the stats file


@dataclass(frozen=True)
class Finish(Message):
    pass


@dataclass(frozen=True)
class LiveInterval(Message):
    attempt: int
    node: str
    node_rank: int  # in this attempt's world
    nnodes: int  # this attempt's world
    ranks: tuple[dict[str, Any], ...]  # the RankSummary per rank, its last windows (stats/job_live.encode_ranks)
    show: bool = True  # node 0: print the job's line (its own line is due); else the metrics only


@dataclass(frozen=True)
class JobLine(Message):
    text: str


@dataclass(frozen=True)
class JobJudged(Message):
    verdict: Judged  # node 0: this interval's job-wide verdict (stats/job_live.py)


@dataclass(frozen=True)
class JobLiveNote(Message):
    text: str  # the job's live verdict's connection to the agents' store changed (stats/job_live_store.py)


@dataclass(frozen=True)
class GpuRound(Message):
    latest: dict[str, dict[str, Any]]  # the last sample per GPU (stats/gpu.py's Sample)
    summaries: dict[str, Any]  # the running summary per GPU: a GpuStats in the codec's JSON, decoded when asked
    events: tuple[GpuEvent, ...]  # the NVML events so far, oldest first


@dataclass(frozen=True)
class GpuError(Message):
    text: str


@dataclass(frozen=True)
class StatsFileError(Message):
    text: str


@dataclass(frozen=True)
class Finished(Message):
    last: GpuRound
    gpu_error: str | None
    stats_file_error: str | None
    stats_file_dropped: int


VOCABULARY = Vocabulary(
    to_helper=(Publish, Append, LiveInterval, Finish),
    to_launcher=(GpuRound, GpuError, StatsFileError, JobLine, JobJudged, JobLiveNote, Finished),
)


class StatsHelper:
    """The launcher's side: non-blocking sends, ``drain`` from the supervisor's event loop.
    ``on_warning`` is told, once each, when NVML did not start in the helper and when the stats
    file could not be written, and each time the job's live verdict's connection to the agents'
    store is lost, made again or given up (at most a few times a job: stats/job_live_store.py)."""

    def __init__(
        self,
        helper: Helper,
        on_warning: Callable[[str], None],
        on_job_line: Callable[[str], None] | None = None,
        on_judged: Callable[[Judged], None] | None = None,
    ) -> None:
        self._helper = helper
        self._on_warning = on_warning
        self._on_job_line = on_job_line  # node 0 of a multi-node job: the job's live line (printed)
        self._on_judged = on_judged  # node 0: every interval's verdict (the straggler policy)
        self.latest: dict[str, Sample] = {}  # the last sample per GPU
        self._summaries: dict[str, Any] = {}  # the running summary per GPU, as sent (decoded when asked)
        self.gpu_events: list[GpuEvent] = []  # NVML events (XID, ECC), oldest first (bounded by the sampler)
        self.gpu_error: str | None = None  # why GPU sampling is off or stopped
        self.stats_file_error: str | None = None
        self.stats_file_dropped = 0
        self._done = False

    @classmethod
    def start(
        cls,
        uuids: Sequence[str],
        gpu_source: Callable[[list[str]], SampleSource] | None,
        metrics_socket: socket.socket | None,
        stats_file: str | None,
        on_warning: Callable[[str], None],
        job_live: JobLiveTarget | None = None,
        on_job_line: Callable[[str], None] | None = None,
        on_judged: Callable[[Judged], None] | None = None,
    ) -> StatsHelper:
        """Fork the helper (the launcher closes its copy of ``metrics_socket``). ``job_live``: a
        multi-node job's store, where the helper sends this node's intervals (stats/job_live.py)."""

        def main(link: Link) -> None:
            _serve(link, list(uuids), gpu_source, metrics_socket, stats_file, job_live)

        keep = (metrics_socket.fileno(),) if metrics_socket is not None else ()
        helper = Helper.fork("openclaw-stats", main, VOCABULARY, keep_fds=keep)
        if metrics_socket is not None:
            metrics_socket.close()
        return cls(helper, on_warning, on_job_line, on_judged)

    @property
    def pid(self) -> int:
        return self._helper.pid

    def fileno(self) -> int:
        return self._helper.fileno()

    @property
    def summaries(self) -> dict[str, GpuStats]:
        """The running summary per GPU (decoded here, not at every round's message: the launcher
        asks only for the live line and at the end; the codec and the type are not start-up imports)."""
        from openclaw_launch.codec import from_json
        from openclaw_launch.stats.result import GpuStats

        return {uuid: from_json(GpuStats, s) for uuid, s in self._summaries.items()}

    def drain(self) -> None:
        for message in self._helper.link.receive():
            self._take(message)

    def publish(self, snap: dict[str, Any]) -> None:
        self._helper.link.send(Publish(snap))

    def live_interval(self, interval: LiveInterval) -> None:
        """This node's interval for the job's live verdict (dropped, not queued, if the link is full:
        the next interval supersedes it)."""
        self._helper.link.send(interval)

    def append(self, snap: dict[str, Any]) -> None:
        if not self._helper.link.send(Append(snap)):
            self.stats_file_dropped += 1

    def finish(self, timeout_s: float = FINISH_TIMEOUT_S) -> None:
        """Ask for the final summaries (bounded), then end the helper. Idempotent."""
        if self._done:
            return
        self._done = True
        link = self._helper.link
        link.send(Finish())
        link.flush(timeout_s)
        done = False
        while not done and not link.closed:
            messages = link.wait(timeout_s)
            if not messages:
                break
            for message in messages:
                self._take(message)
                done = done or isinstance(message, Finished)
        self._helper.end()

    def _take(self, message: Message) -> None:
        match message:
            case GpuRound():
                self._take_round(message)
            case GpuError(text=text):
                self.gpu_error = text
                self._on_warning(text)
            case JobLine(text=text) if self._on_job_line is not None:
                self._on_job_line(text)
            case JobJudged(verdict=verdict) if self._on_judged is not None:
                self._on_judged(verdict)
            case JobLiveNote(text=text):
                self._on_warning(f"job stats: {text}")
            case StatsFileError(text=text) if self.stats_file_error is None:
                self.stats_file_error = text
                self._on_warning(f"{text}; the job goes on, later lines may be lost (in the report)")
            case Finished():
                self._take_round(message.last)
                self.gpu_error = self.gpu_error or message.gpu_error
                self.stats_file_error = self.stats_file_error or message.stats_file_error
                self.stats_file_dropped += message.stats_file_dropped

    def _take_round(self, gpus: GpuRound) -> None:
        self.latest = gpus.latest
        self._summaries = gpus.summaries
        self.gpu_events = list(gpus.events)


def _serve(
    link: Link,
    uuids: list[str],
    gpu_source: Callable[[list[str]], SampleSource] | None,
    metrics_socket: socket.socket | None,
    stats_file: str | None,
    job_live: JobLiveTarget | None = None,
) -> None:
    """The helper's main thread: start the parts, then follow the launcher's messages until
    ``Finish`` or EOF (the launcher is gone: nobody to answer)."""
    from openclaw_launch.stats.metrics import MetricsServer, StatsFile

    server = MetricsServer(metrics_socket) if metrics_socket is not None else None
    live = None
    if job_live is not None:  # the store's I/O on a thread of its own: a slow store never delays the link
        from openclaw_launch.stats.job_live_thread import JobLive

        def job_line(text: str) -> None:
            link.send(JobLine(text))

        def judged(verdict: Judged) -> None:
            link.send(JobJudged(verdict))

        def note(text: str) -> None:
            link.send(JobLiveNote(text))

        live = JobLive(job_live, job_line, server.publish_job if server is not None else None, judged, note)

    def file_error(text: str) -> None:  # from the writer's thread (the link's sends are serialised)
        link.send(StatsFileError(text))

    writer = StatsFile(stats_file, file_error) if stats_file else None
    sampler = _start_sampler(link, uuids, gpu_source)
    finish = False
    while not finish and not link.closed:
        for message in link.wait(None):
            match message:
                case Publish(snap=snap) if server is not None:
                    server.publish(snap)
                case Append(snap=snap) if writer is not None:
                    writer.append(snap)
                case LiveInterval() if live is not None:
                    from openclaw_launch.stats.job_live_thread import Interval

                    live.submit(
                        Interval(message.attempt, message.node, message.node_rank, message.nnodes, message.ranks)
                    )
                case Finish():
                    finish = True
    if sampler is not None:
        sampler.stop()
    if live is not None:
        live.close()
    if writer is not None:
        writer.close()
    # The endpoint goes with the process: a polite shutdown waits out serve_forever's 0.5 s poll.
    if finish:
        last = _round(sampler) if sampler is not None else GpuRound({}, {}, ())
        gpu_error = sampler.error if sampler is not None else None
        file_error_text = writer.error if writer is not None else None
        link.send(Finished(last, gpu_error, file_error_text, writer.dropped if writer is not None else 0))


def _start_sampler(
    link: Link, uuids: list[str], gpu_source: Callable[[list[str]], SampleSource] | None
) -> GpuSampler | None:
    if not uuids or gpu_source is None:
        return None
    from openclaw_launch.stats.gpu import GpuSampler

    def send(sampler: GpuSampler) -> None:
        link.send(_round(sampler))

    try:
        return GpuSampler(gpu_source(uuids), uuids, on_round=send).start()
    except Exception as exc:  # no NVML in this container, a driver mismatch: statistics go on
        link.send(GpuError(f"GPU sampling off: {exc}"))
        return None


def _round(sampler: GpuSampler) -> GpuRound:
    """What the sampler has now (the summaries in the codec's JSON: the launcher decodes them when asked)."""
    from openclaw_launch.codec import to_json

    events = tuple(GpuEvent(str(e["kind"]), str(e["uuid"]), int(e["code"])) for e in sampler.events())
    return GpuRound(sampler.latest(), to_json(sampler.summaries()), events)
