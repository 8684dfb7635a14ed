"""Live numbers while the job runs: a Prometheus endpoint (``--metrics-port``) and a JSON-lines file
(``--stats-file``). The supervision loop builds a snapshot (``snapshot``) and hands it to the
statistics helper process (stats/helper.py), where the HTTP server and the file writer run on
threads of their own, so a slow scraper or a slow disk never delays supervision and the launcher
forks with one thread. The launcher binds the endpoint's socket itself (``listen``): the port is
known, and a busy one an error, before any worker starts. Metric names and labels:
docs/hangs-and-metrics.md.
"""

from __future__ import annotations

import importlib.util
import json
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from openclaw_launch.errors import LaunchError

if TYPE_CHECKING:
    from openclaw_launch.plan.model import LaunchPlan
    from openclaw_launch.stats.collect import RankSummary

REFRESH_S = 1.0  # the endpoint's numbers are at most this old
WORKER_STATES = ("starting", "running", "finished", "hung")
_QUANTILES = (("0.5", "step_p50_s"), ("0.9", "step_p90_s"), ("0.99", "step_p99_s"))
_RANK_LABELS = ("run_id", "node", "rank", "local_rank", "gpu_uuid")


def snapshot(
    plan: LaunchPlan,
    attempt: int,
    summaries: list[RankSummary],
    states: Mapping[int, str],
    gpus: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:
    """One JSON-able picture of the job now (a line of --stats-file; the endpoint's source)."""
    by_rank = {s.rank: s for s in summaries}
    ranks = []
    for r in plan.ranks:
        s = by_rank.get(r.rank)
        entry: dict[str, Any] = {
            "rank": r.rank,
            "local_rank": r.local_rank,
            "gpu_uuid": r.gpu_uuid,
            "state": states.get(r.rank, "starting"),
            "steps": s.steps if s else 0,
        }
        if s is not None and s.measured_steps:
            entry.update(
                step_p50_s=round(s.step_p50_s, 6),
                step_p90_s=round(s.step_p90_s, 6),
                step_p99_s=round(s.step_p99_s, 6),
                step_mean_s=round(s.step_mean_s, 6),
                phase_share={name: round(p.share, 4) for name, p in s.phases.items()},
                step_total_s=round(s.step_mean_s * s.measured_steps, 6),
                busy_total_s=round(max(s.step_mean_s - s.wait_s, 0.0) * s.measured_steps, 6),
            )
        ranks.append(entry)
    return {
        "time": round(time.time(), 3),
        "run_id": plan.run_id,
        "node": plan.node,
        "restarts": attempt,
        "ranks": ranks,
        "gpus": {u: {k: round(v, 3) for k, v in sample.items()} for u, sample in gpus.items()},
    }


class BusyShare:
    """Each rank's busy share over the interval since the previous snapshot it saw: the share of its
    step time not in the phases that wait for peers (``sync_phases``), from the snapshot's running
    totals (``busy_total_s``, ``step_total_s``, after warm-up). One per consumer (the stats file,
    the endpoint), since each has its own interval. A total that went down is a new attempt: its
    interval starts from zero."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float]] = {}  # rank -> (step_total_s, busy_total_s)

    def annotate(self, snap: dict[str, Any]) -> dict[str, Any]:
        """``snap`` with ``busy_share`` on every rank that stepped in the interval (null: no step)."""
        for entry in snap["ranks"]:
            step, busy = entry.get("step_total_s"), entry.get("busy_total_s")
            if step is None or busy is None:
                continue
            last_step, last_busy = self._last.get(entry["rank"], (0.0, 0.0))
            if step < last_step:
                last_step = last_busy = 0.0
            self._last[entry["rank"]] = (step, busy)
            stepped = step - last_step
            entry["busy_share"] = round(min(max((busy - last_busy) / stepped, 0.0), 1.0), 4) if stepped > 0 else None
        return snap


class _Collector:
    """prometheus-client's custom-collector protocol over the latest snapshot."""

    def __init__(self) -> None:
        self.latest: dict[str, Any] | None = None
        self.job: dict[str, Any] | None = None  # node 0 of a multi-node job: every node's (stats/job_live.py)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self.job is not None:
            yield from _job_families(self.job)
        snap = self.latest
        if snap is None:
            return
        job = [str(snap["run_id"]), str(snap["node"])]
        restarts = GaugeMetricFamily("openclaw_restarts", "Restarts of the job so far", labels=["run_id", "node"])
        restarts.add_metric(job, snap["restarts"])
        yield restarts
        excluded = CounterMetricFamily(
            "openclaw_node_exclusions",
            "Nodes the elastic job took out for good, by reason",
            labels=["run_id", "node", "reason"],
        )
        for reason, count in sorted(snap.get("exclusions", {}).items()):
            excluded.add_metric([*job, reason], count)
        yield excluded
        steps = CounterMetricFamily("openclaw_steps", "Steps done in this attempt", labels=list(_RANK_LABELS))
        step_time = GaugeMetricFamily(
            "openclaw_step_time_seconds", "Step time quantile (after warm-up)", labels=[*_RANK_LABELS, "quantile"]
        )
        share = GaugeMetricFamily(
            "openclaw_phase_share", "Share of the mean step spent in a phase", labels=[*_RANK_LABELS, "phase"]
        )
        state = GaugeMetricFamily(
            "openclaw_worker_state", "1 for the worker's current state", labels=[*_RANK_LABELS, "state"]
        )
        busy = GaugeMetricFamily(
            "openclaw_busy_share",
            "Share of the step time not waiting for peers, over the last refresh interval with a step",
            labels=list(_RANK_LABELS),
        )
        step_total = CounterMetricFamily(
            "openclaw_step_seconds", "Step time summed over the measured steps (after warm-up)", labels=[*_RANK_LABELS]
        )
        busy_total = CounterMetricFamily(
            "openclaw_busy_seconds", "Of openclaw_step_seconds, the time not waiting", labels=[*_RANK_LABELS]
        )
        for r in snap["ranks"]:
            labels = [*job, str(r["rank"]), str(r["local_rank"]), r["gpu_uuid"] or ""]
            steps.add_metric(labels, r["steps"])
            for q, key in _QUANTILES:
                if key in r:
                    step_time.add_metric([*labels, q], r[key])
            for phase, value in r.get("phase_share", {}).items():
                share.add_metric([*labels, phase], value)
            for name in WORKER_STATES:
                state.add_metric([*labels, name], 1.0 if r["state"] == name else 0.0)
            if r.get("busy_share") is not None:
                busy.add_metric(labels, r["busy_share"])
            if "step_total_s" in r:
                step_total.add_metric(labels, r["step_total_s"])
                busy_total.add_metric(labels, r["busy_total_s"])
        yield from (steps, step_time, share, state, busy, step_total, busy_total)
        gpu_families: dict[str, Any] = {}
        for uuid, sample in snap["gpus"].items():
            for key, value in sample.items():
                fam = gpu_families.get(key)
                if fam is None:
                    fam = gpu_families[key] = GaugeMetricFamily(
                        f"openclaw_gpu_{key}", f"NVML: {key} (latest sample)", labels=["run_id", "node", "gpu_uuid"]
                    )
                fam.add_metric([*job, uuid], value)
        yield from gpu_families.values()


def _job_families(job: Mapping[str, Any]) -> Iterator[Any]:
    """The job-wide numbers node 0 judged at its last live line: every node's ranks, the straggler."""
    from prometheus_client.core import GaugeMetricFamily

    run = str(job["run_id"])
    nodes = GaugeMetricFamily(
        "openclaw_job_nodes_reporting", "Nodes whose interval the job's live verdict judged", labels=["run_id"]
    )
    nodes.add_metric([run], job["nodes_reporting"])
    steps = GaugeMetricFamily(
        "openclaw_job_steps", "Steps done in this attempt, every node's ranks", labels=["run_id", "node", "rank"]
    )
    p50 = GaugeMetricFamily(
        "openclaw_job_step_p50_seconds", "Median step of the attempt (after warm-up)", labels=["run_id", "node", "rank"]
    )
    for r in job["ranks"]:
        labels = [run, str(r["node"]), str(r["rank"])]
        steps.add_metric(labels, r["steps"])
        if r["step_p50_s"] is not None:
            p50.add_metric(labels, r["step_p50_s"])
    straggler = GaugeMetricFamily(
        "openclaw_job_straggler_excess_ratio",
        "The job's live straggler: its excess over the others' pace, a share of the step (a pipeline stage's: of its "
        "own work, the step less its waits for the other stages; absent: none)",
        labels=["run_id", "node", "rank", "phase", "section"],
    )
    for s in job["stragglers"]:
        straggler.add_metric([run, str(s["node"]), str(s["rank"]), s["phase"], s["section"]], s["excess_pct"] / 100)
    yield from (nodes, steps, p50, straggler)


def listen(port: int) -> socket.socket:
    """``--metrics-port``'s listening socket (0: a free port), in the launcher; served by the helper."""
    if importlib.util.find_spec("prometheus_client") is None:
        raise LaunchError("--metrics-port needs prometheus-client: pip install 'openclaw-launch[metrics]'")
    try:
        return socket.create_server(("0.0.0.0", port), backlog=64)  # SO_REUSEADDR, as prometheus-client's
    except OSError as exc:
        raise LaunchError(f"--metrics-port {port}: cannot listen: {exc}") from exc


class MetricsServer:
    """prometheus-client's handler on a listening socket, one thread per request (in the helper,
    which ends it by exiting)."""

    def __init__(self, sock: socket.socket) -> None:
        from http.server import ThreadingHTTPServer

        from prometheus_client.core import CollectorRegistry
        from prometheus_client.exposition import MetricsHandler

        self._collector = _Collector()
        self._busy = BusyShare()
        self._shown: dict[int, float] = {}  # rank -> the busy share of its last interval with a step
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self._collector)
        server = ThreadingHTTPServer(sock.getsockname()[:2], MetricsHandler.factory(registry), bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="openclaw-metrics", daemon=True).start()

    def publish(self, snap: dict[str, Any]) -> None:
        """The endpoint's numbers now; a rank with no step since the last refresh keeps its last
        interval's busy share (a refresh is shorter than a slow step)."""
        for entry in self._busy.annotate(snap)["ranks"]:
            if entry.get("busy_share") is not None:
                self._shown[entry["rank"]] = entry["busy_share"]
            elif entry["rank"] in self._shown and "step_total_s" in entry:
                entry["busy_share"] = self._shown[entry["rank"]]
        self._collector.latest = snap  # one reference: the server thread sees the old or the new one

    def publish_job(self, job: dict[str, Any]) -> None:
        """node 0 of a multi-node job: the job-wide numbers (from the helper's job-live thread)."""
        self._collector.job = job


class StatsFile:
    """``--stats-file``: one JSON line per interval, appended by a writer thread of the helper (a
    slow or full disk drops lines, counted in ``dropped``, instead of delaying the helper's link)."""

    def __init__(self, path: str, on_error: Callable[[str], None] = lambda text: None) -> None:
        self.path = path
        self.dropped = 0
        self.error: str | None = None
        self._on_error = on_error  # told of the first error (the launcher's console and report)
        self._busy = BusyShare()  # each line's busy share: over the interval since the line before
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=64)
        self._thread = threading.Thread(target=self._run, name="openclaw-stats-file", daemon=True)
        self._thread.start()

    def append(self, snap: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(json.dumps(self._busy.annotate(snap), separators=(",", ":")) + "\n")
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while (line := self._queue.get()) is not None:
            try:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(line)
            except OSError as exc:
                if self.error is None:
                    self.error = f"--stats-file {self.path}: cannot append: {exc.strerror or exc}"
                    self._on_error(self.error)

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout=timeout_s)
