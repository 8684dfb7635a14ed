"""The job's live verdict across nodes: every node's interval summary, judged together on node 0.

Each node's live line judges only its own ranks; a straggler on another node shows there only as
waiting. So at every tick of its live line's timer the launcher hands its ranks' summaries of the attempt (collect.py's
``RankSummary``, each with only its last ``LIVE_WINDOWS`` windows of 5 steps: the verdict compares
ranks window by window, so the job's line judges the last 120 steps at most, and the bytes per node
stay bounded however long the job) to its statistics helper process (stats/helper.py). The helper,
on a thread of its own (stats/job_live_thread.py), writes them to the agents' store (agents/store.py, through the
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
(``GROUP_WORLD_SIZE``), and a node whose key stopped changing is left out of the verdict and named
as silent.

Two windows, one for each use: the line (and the metrics) judge each rank's last ``LIVE_WINDOWS``
windows, steady from one interval to the next; node 0's straggler policy (agents/straggler_policy.py)
gets the verdict over the windows since its previous judged interval (``judge_interval``; topped up
with the latest earlier ones to the verdict's minimum), so that each interval in a row brings new
steps, and a slowdown counts from its first interval, not once its windows are most of the line's.
For the policy, node 0 reads again, for up to half a tick, the keys of the nodes whose summaries end
before its own (stats/job_live_thread.py ``JobLive._caught_up``): their tick came just after its own.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openclaw_launch.codec import from_json, to_json
from openclaw_launch.stats.collect import STEP, RankSummary
from openclaw_launch.stats.job_live_store import StoreClient
from openclaw_launch.stats.judged import Judged, excess_text

if TYPE_CHECKING:
    from openclaw_launch.stats.result import Straggler

KEY_ROOT = "openclaw/live"  # under the agents' own prefix (agents/store.py PREFIX)
LIVE_WINDOWS = 24  # the windows (of 5 steps) a rank's interval summary carries: the verdict's evidence
LIVE_MIN_STEPS = 20  # measured steps a rank needs in the attempt before the job's line judges (4 windows)


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
