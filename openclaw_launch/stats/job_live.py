"""The job's live verdict across nodes: every node's interval summary, judged together on node 0.

Each node's live line judges only its own ranks; a straggler on another node shows there only as
waiting. So at every tick of its live line's timer the launcher hands its ranks' summaries of the attempt (collect.py's
``RankSummary``, each with only its last ``LIVE_WINDOWS`` windows of 5 steps: the verdict compares
ranks window by window, so the job's line judges the last 120 steps at most, and the bytes per node
stay bounded however long the job) to its statistics helper process (stats/helper.py). The helper,
on a thread of its own, writes them to the agents' store (agents/store.py, through the
standard-library client agents/tcpstore_client.py) under ``node_key``: the run id, the attempt and
the node rank, one key per node, overwritten each interval, on the one connection the helper holds
for the job's life (stats/job_live_store.py). Node 0's helper then reads every
node's key of the attempt with one ``multi_get`` (a ``check`` first for the keys it has not seen
yet: ``multi_get`` waits for all its keys), judges the merged ranks with the verdict's own pure
functions (stats/verdict.py ``find_stragglers``), sends the line to its launcher, which prints it
(``openclaw-launch: job stats: ...``), and serves the job-wide numbers on node 0's
``--metrics-port`` (stats/metrics.py ``openclaw_job_*``).

Nothing here runs in the launcher's process but the encoding (``encode_ranks``): the network I/O
is the helper's, never the supervisor loop's. A store that cannot be reached (node 0 gone at the
job's end, a restart's re-formed world) costs that interval's line and nothing else; the thread
connects again once, at the next one (at most ``MAX_CONNECTIONS`` in the job).

The attempt contract: the key carries the attempt, so a restart's (or a re-formed world's) first
line judges only that attempt's summaries; the node count of the attempt is the world's
(``GROUP_WORLD_SIZE``), and a node whose key did not change over ``STALE_READS`` reads is left
out of the verdict and named as silent.

Two windows, one for each use: the line (and the metrics) judge each rank's last ``LIVE_WINDOWS``
windows, steady from one interval to the next; node 0's straggler policy (agents/straggler_policy.py)
gets the verdict over the windows since its previous judged interval (``judge_interval``; topped up
with the latest earlier ones to the verdict's minimum), so that each interval in a row brings new
steps, and a slowdown counts from its first interval, not once its windows are most of the line's.
For the policy, node 0 reads again, for up to half a tick, the keys of the nodes whose summaries end
before its own (``JobLive._caught_up``): their tick came just after its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openclaw_launch.codec import from_json, to_json
from openclaw_launch.stats.collect import STEP, RankSummary
from openclaw_launch.stats.job_live_store import HeldConnection, StoreClient
from openclaw_launch.stats.judged import Judged, excess_text

if TYPE_CHECKING:
    from openclaw_launch.stats.result import Straggler

KEY_ROOT = "openclaw/live"  # under the agents' own prefix (agents/store.py PREFIX)
LIVE_WINDOWS = 24  # the windows (of 5 steps) a rank's interval summary carries: the verdict's evidence
CLOSE_WAIT_S = 0.5  # at the end, how long the helper waits for a call in flight (it exits anyway)
STALE_READS = 3  # node 0's reads with a node's key unchanged before that node is left out
LIVE_MIN_STEPS = 20  # measured steps a rank needs in the attempt before the job's line judges (4 windows)
# node 0's straggler policy: a node whose summary ends before node 0's own last window is read again,
# up to CATCH_UP_READS times, CATCH_UP_SHARE of a tick (the time between node 0's intervals) apart in all
CATCH_UP_SHARE = 0.5
CATCH_UP_READS = 5


@dataclass(frozen=True)
class JobLiveTarget:
    """Where the nodes' summaries meet: the agents' store, and what names and judges them.
    ``connect(host, port, timeout_s)`` is the store's client, given from above (job/agents.py):
    stats/ is below agents/."""

    host: str
    port: int
    run_id: str
    threshold_pct: float
    connect: Callable[[str, int, float], StoreClient]


@dataclass(frozen=True)
class NodeInterval:
    """One node's interval, as written to its key."""

    node: str
    node_rank: int
    seq: int  # this node's lines in this attempt: a key that does not move is a silent node
    ranks: tuple[RankSummary, ...]


@dataclass(frozen=True)
class JobVerdict:
    text: str
    nodes: tuple[NodeInterval, ...]  # those judged
    found: tuple[Straggler, ...]
    silent: tuple[int, ...]  # node ranks with no fresh summary
    step_p50_s: float | None = None  # the median of the ranks' median steps (None: no measured step)
    judged: bool = False  # every rank had LIVE_MIN_STEPS: the verdict judged (found may still be empty)


def judged_of(attempt: int, verdict: JobVerdict) -> Judged:
    """The verdict's first straggler (the one the line names) with its node's rank, or none."""
    if not verdict.found:
        return Judged(attempt, verdict.judged, verdict.step_p50_s)
    s = verdict.found[0]
    node_rank = next((n.node_rank for n in verdict.nodes if any(r.rank == s.rank for r in n.ranks)), -1)
    return Judged(
        attempt,
        verdict.judged,
        verdict.step_p50_s,
        s.node,
        node_rank,
        s.rank,
        s.excess_pct,
        s.phase,
        s.section,
        s.pct_of,
    )


def node_key(run_id: str, attempt: int, node_rank: int) -> str:
    return f"{KEY_ROOT}/{run_id}/{attempt}/{node_rank}"


def encode_ranks(ranks: Sequence[RankSummary]) -> tuple[dict[str, Any], ...]:
    """The launcher's part: the summaries as JSON, each with its last ``LIVE_WINDOWS`` windows (the
    verdict's evidence; the bytes per node stay bounded however long the attempt)."""
    return tuple(to_json(dataclasses.replace(r, windows=_recent(r.windows))) for r in ranks)


def _recent(windows: Sequence[tuple[int, Mapping[str, float]]]) -> tuple[tuple[int, Mapping[str, float]], ...]:
    """The last ``LIVE_WINDOWS`` windows, their medians to 0.1 us (30 % fewer bytes; the verdict's
    differences are tenths of a millisecond at the least)."""
    return tuple((k, {name: round(v, 7) for name, v in w.items()}) for k, w in windows[-LIVE_WINDOWS:])


def encode_node(node: str, node_rank: int, seq: int, ranks: Sequence[dict[str, Any]]) -> bytes:
    payload = {"node": node, "node_rank": node_rank, "seq": seq, "ranks": list(ranks)}
    return json.dumps(payload, separators=(",", ":")).encode()


def decode_node(blob: bytes) -> NodeInterval | None:
    """A node's key, or None for a value this version cannot read (a newer writer's, a torn one)."""
    try:
        data = json.loads(blob)
        ranks = tuple(from_json(RankSummary, r) for r in data["ranks"])
        return NodeInterval(str(data["node"]), int(data["node_rank"]), int(data["seq"]), ranks)
    except (ValueError, KeyError, TypeError):
        return None


def judge(nodes: Sequence[NodeInterval], nnodes: int, silent: Sequence[int], threshold_pct: float) -> JobVerdict:
    """The job's live line over every node's ranks. Pure: the verdict's ``find_stragglers`` on the
    merged summaries, the node of each rank from its node's key."""
    from openclaw_launch.stats import verdict

    ranks = sorted((r for n in nodes for r in n.ranks), key=lambda r: r.rank)
    facts = {r.rank: verdict.RankFacts(node=n.node) for n in nodes for r in n.ranks}
    head = f"{len(nodes)} of {nnodes} node(s), {len(ranks)} rank(s)"
    if silent:
        head += f" (silent: node rank(s) {', '.join(str(k) for k in silent)})"
    measured = [r for r in ranks if r.measured_steps]
    if not measured:
        return JobVerdict(head + "; no measured steps yet", tuple(nodes), (), tuple(silent))
    p50 = statistics.median(r.step_p50_s for r in measured)
    text = f"{head}, step p50 {1000 * p50:.1f} ms"
    if min(r.measured_steps for r in measured) < LIVE_MIN_STEPS:
        text += f"; too few steps to judge (fewer than {LIVE_MIN_STEPS} on a rank)"
        return JobVerdict(text, tuple(nodes), (), tuple(silent), p50)
    found = tuple(verdict.find_stragglers(measured, facts, threshold_pct))
    if found:
        s = found[0]
        excess = excess_text(s.excess_pct, s.pct_of)
        text += f"; straggler: node {s.node} rank {s.rank} ({s.phase}, {s.section}) {excess}"
        text += f" ({1000 * s.excess_s:.1f} ms/step)"
        if any(h.startswith("pipeline:") for h in s.hints):
            text += ", the stage that bounds the pipeline"
    else:
        text += "; no straggler"
    return JobVerdict(text, tuple(nodes), found, tuple(silent), p50, judged=True)


def judge_interval(
    nodes: Sequence[NodeInterval], nnodes: int, silent: Sequence[int], threshold_pct: float, after: int
) -> tuple[JobVerdict | None, int]:
    """The straggler policy's evidence: the verdict (``judge``) over the windows every rank has after
    window ``after`` (the last one the previous judged interval judged), its ``step_p50_s`` theirs.
    The verdict trusts a spread over the verdict's ``MIN_WINDOWS`` windows at the least (under them
    it would fall back to the attempt's means): an interval with fewer new ones is topped up with the
    latest windows before them, so that every live interval with a new window is judged (a node
    slowed to 61 ms steps closes about 1.6 windows in a 0.5 s interval). Each judged interval brings
    at least one window of new steps; a run of N judged intervals spans ``MIN_WINDOWS + N - 1``
    windows at the least. None while no window is new (or the ranks have fewer than ``MIN_WINDOWS``
    in common). Returns the verdict and the last window it judged (the next one's ``after``)."""
    from openclaw_launch.stats.verdict import MIN_WINDOWS

    measured = [r for n in nodes for r in n.ranks if r.measured_steps]
    common = sorted(set.intersection(*({k for k, _ in r.windows} for r in measured))) if measured else []
    fresh = [k for k in common if k > after]
    if not fresh or len(common) < MIN_WINDOWS:
        return None, after
    picked = set(common[-max(len(fresh), MIN_WINDOWS) :])

    def judged(r: RankSummary) -> RankSummary:
        return dataclasses.replace(r, windows=tuple(w for w in r.windows if w[0] in picked))

    since = [dataclasses.replace(n, ranks=tuple(judged(r) for r in n.ranks)) for n in nodes]
    verdict = judge(since, nnodes, silent, threshold_pct)
    steps = [statistics.median(w.get(STEP, 0.0) for k, w in r.windows if k in picked) for r in measured]
    return dataclasses.replace(verdict, step_p50_s=statistics.median(steps)), common[-1]


def job_snapshot(run_id: str, attempt: int, judged: JobVerdict) -> dict[str, Any]:
    """node 0's job-wide numbers for the metrics endpoint (stats/metrics.py ``openclaw_job_*``)."""
    ranks = [
        {"node": n.node, "rank": r.rank, "steps": r.steps, "step_p50_s": r.step_p50_s if r.measured_steps else None}
        for n in judged.nodes
        for r in n.ranks
    ]
    stragglers = [
        {"node": s.node, "rank": s.rank, "phase": s.phase, "section": s.section, "excess_pct": s.excess_pct}
        for s in judged.found
    ]
    return {
        "run_id": run_id,
        "restarts": attempt,
        "nodes_reporting": len(judged.nodes),
        "ranks": ranks,
        "stragglers": stragglers,
    }


@dataclass(frozen=True)
class Interval:
    """What the helper's thread is given at each of its node's live lines."""

    attempt: int
    node: str
    node_rank: int
    nnodes: int
    ranks: tuple[dict[str, Any], ...]
    show: bool = True  # node 0 prints the line (its own live line is due); the metrics are updated anyway


class JobLive:
    """The helper's side: a thread that connects to the store once, then takes the latest interval
    (an older one not yet sent is dropped: only the newest matters), writes it, and on node 0 reads
    and judges every node's."""

    def __init__(
        self,
        target: JobLiveTarget,
        on_line: Callable[[str], None],
        on_snapshot: Callable[[dict[str, Any]], None] | None,
        on_judged: Callable[[Judged], None] | None = None,
        on_note: Callable[[str], None] = lambda text: None,
    ) -> None:
        """Node 0: ``on_line`` gets the job's line when it is shown, ``on_snapshot`` the metrics and
        ``on_judged`` the verdict (its straggler policy, agents/straggler_policy.py) every interval.
        Every node: ``on_note`` is told when its connection to the store is lost, made again or
        given up (stats/job_live_store.py)."""
        self.target = target
        self._on_line = on_line
        self._on_snapshot = on_snapshot
        self._on_judged = on_judged
        self._queue: queue.Queue[Interval | None] = queue.Queue(maxsize=1)
        self._store = HeldConnection(target.connect, target.host, target.port, on_note)
        self._seq: dict[int, int] = {}  # attempt -> this node's lines in it
        self._seen: dict[str, tuple[int, int]] = {}  # key -> (seq, reads it stayed so)
        self._attempt = -1
        self._judged_upto = -1  # the policy's last judged window of the attempt (judge_interval)
        self._submitted_s: float | None = None  # when the latest interval was given (monotonic)
        self._tick_s = 0.0  # the time between the last two (0: not known yet)
        self._closing = threading.Event()
        self.errors = 0  # intervals lost to the store (not reached, failed mid-call)
        self._thread = threading.Thread(target=self._run, name="openclaw-job-live", daemon=True)
        self._thread.start()

    def submit(self, interval: Interval) -> None:
        now_s = time.monotonic()
        if self._submitted_s is not None:
            self._tick_s = now_s - self._submitted_s
        self._submitted_s = now_s
        self._replace(interval)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stop after the call in flight, waiting for it only briefly: at the job's end the first
        node's store may be gone already, and a write left unfinished loses nothing."""
        self._closing.set()
        self._replace(None)
        self._thread.join(timeout=timeout_s)

    def _replace(self, item: Interval | None) -> None:
        """The one not yet taken is superseded (a racing put of the thread's own cannot happen: only
        this thread puts)."""
        with contextlib.suppress(queue.Empty):
            self._queue.get_nowait()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(item)

    @property
    def connections(self) -> int:
        """The connections to the store this node's thread has opened (or tried) so far in the job."""
        return self._store.opened

    def _run(self) -> None:
        self._store.open()
        while (interval := self._queue.get()) is not None:
            try:
                self._once(interval, self._store.client())
            except Exception as exc:  # the store gone or out of protocol: this line is lost, the next reconnects once
                self.errors += 1
                self._store.lost(exc)
                if interval.node_rank == 0 and interval.show:  # node 0's line says so, never goes silent
                    self._on_line(self._lost_line(exc))
        self._store.close()

    def _lost_line(self, exc: Exception) -> str:
        """Node 0's line for an interval the store did not answer (its own write, a read of the
        nodes' summaries): the job's verdict is missing this interval, and why."""
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"no verdict this interval: the agents' store at {self._store.where} did not answer ({why}); "
            f"{self.errors} interval(s) lost so far"
        )

    def _once(self, interval: Interval, store: StoreClient) -> None:
        if interval.attempt != self._attempt:  # a restart or a re-formed world: from nothing
            self._attempt, self._seen, self._judged_upto = interval.attempt, {}, -1
        seq = self._seq[interval.attempt] = self._seq.get(interval.attempt, 0) + 1
        run_id = self.target.run_id
        blob = encode_node(interval.node, interval.node_rank, seq, interval.ranks)
        store.set(node_key(run_id, interval.attempt, interval.node_rank), blob)
        if interval.node_rank != 0:
            return
        keys = [node_key(run_id, interval.attempt, k) for k in range(interval.nnodes)]
        ready = [k for k in keys if k in self._seen or store.check([k])]
        read = _read(store, ready)
        if self._on_judged is not None:
            read = self._caught_up(store, read, node_key(run_id, interval.attempt, 0))
        nodes, silent = [], []
        for key, node in read.items():
            last_seq, unchanged = self._seen.get(key, (-1, 0))
            unchanged = unchanged + 1 if node.seq == last_seq else 0
            self._seen[key] = (node.seq, unchanged)
            if unchanged >= STALE_READS:
                silent.append(node.node_rank)
            else:
                nodes.append(node)
        silent += [k for k, key in enumerate(keys) if key not in self._seen]
        judged = judge(nodes, interval.nnodes, sorted(silent), self.target.threshold_pct)
        if interval.show:
            self._on_line(judged.text)
        if self._on_judged is not None:
            self._judge_interval(interval, nodes, sorted(silent), judged)
        if self._on_snapshot is not None:
            self._on_snapshot(job_snapshot(run_id, interval.attempt, judged))

    def _caught_up(self, store: StoreClient, read: dict[str, NodeInterval], own: str) -> dict[str, NodeInterval]:
        """The policy's read, with the nodes whose summaries end before node 0's own last window read
        again until they catch up (at most ``CATCH_UP_READS`` times, within ``CATCH_UP_SHARE`` of a
        tick). Why: the nodes' ticks start together with the world, so another node often writes just
        after node 0 reads, and its slow steps would wait a whole tick more to be judged. Only the
        straggler policy's node 0 pays these reads; a node that never catches up costs them each tick."""
        if own not in read or self._tick_s <= 0:
            return read
        target = _last_window(read[own])
        for _ in range(CATCH_UP_READS):
            behind = [key for key, node in read.items() if _last_window(node) < target]
            if not behind or self._closing.wait(self._tick_s * CATCH_UP_SHARE / CATCH_UP_READS):
                break
            read.update(_read(store, behind))
        return read

    def _judge_interval(
        self, interval: Interval, nodes: Sequence[NodeInterval], silent: Sequence[int], line: JobVerdict
    ) -> None:
        """Node 0's policy gets the interval's own verdict; while the attempt has too few steps for
        the line, that (it starts the policy's count again); an interval with too few new windows
        gives nothing (the next judges its steps)."""
        assert self._on_judged is not None
        if not line.judged:
            self._on_judged(judged_of(interval.attempt, line))
            return
        verdict, self._judged_upto = judge_interval(
            nodes, interval.nnodes, silent, self.target.threshold_pct, self._judged_upto
        )
        if verdict is not None:
            self._on_judged(judged_of(interval.attempt, verdict))


def _read(store: StoreClient, keys: Sequence[str]) -> dict[str, NodeInterval]:
    """The nodes' keys that hold a summary this version reads."""
    values = store.multi_get(keys) if keys else []
    return {key: node for key, value in zip(keys, values, strict=True) if (node := decode_node(value)) is not None}


def _last_window(node: NodeInterval) -> int:
    """The last window any of the node's ranks closed (-1: none yet)."""
    return max((r.windows[-1][0] for r in node.ranks if r.windows), default=-1)
