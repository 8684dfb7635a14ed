"""The job's live verdict, the helper's side: a thread in each node's statistics helper process
(stats/helper.py) that writes the node's interval summary to the agents' store and, on node 0, reads
every node's and judges them (stats/job_live.py: the keys, the encoding and the verdict, pure).

Each interval the helper hands the thread the latest summaries; one not yet sent is superseded (only
the newest matters), so a slow store never queues work. The thread holds one store connection for the
job's life (stats/job_live_store.py). A node whose key did not change over ``STALE_READS`` reads is
left out of the verdict and named as silent. For node 0's straggler policy, the nodes whose summaries
end before node 0's own are read again for up to half a tick (``JobLive._caught_up``): their tick came
just after its own.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_launch.stats.job_live import (
    JobLiveTarget,
    JobVerdict,
    NodeInterval,
    decode_node,
    encode_node,
    job_snapshot,
    judge,
    judge_interval,
    judged_of,
    node_key,
)
from openclaw_launch.stats.job_live_store import HeldConnection, StoreClient
from openclaw_launch.stats.judged import Judged

CLOSE_WAIT_S = 0.5  # at the end, how long the helper waits for a call in flight (it exits anyway)
STALE_READS = 3  # node 0's reads with a node's key unchanged before that node is left out
# node 0's straggler policy: a node whose summary ends before node 0's own last window is read again,
# up to CATCH_UP_READS times, CATCH_UP_SHARE of a tick (the time between node 0's intervals) apart in all
CATCH_UP_SHARE = 0.5
CATCH_UP_READS = 5


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
