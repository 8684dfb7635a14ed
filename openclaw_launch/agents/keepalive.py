"""The keep-alive and the attempt's end, at a cost per node and tick that does not grow with the job
(issue 29: when every node read every node's counter, the store's load grew with the square of the
nodes, and so did each launcher's idle CPU).

One node watches every other: node rank 0, whose launcher hosts the store. Every beat period
(``--keepalive-s`` / 10, at least the store loop's tick):

- every node bumps its own counter ``hb/r`` with one ``add`` when its launcher's loop ticked since
  the last beat;
- node 0 reads every other node's counter with one ``multi_get``; any other node reads only node 0's
  (``add`` of 0: one call, no wait). A counter that stood still for ``--keepalive-s`` less two beat
  periods (a beat and a read apart) is a lost node, unless that node's end of the attempt is in
  (teardown, backoff): a frozen launcher is found within ``--keepalive-s`` of its last beat.

And every tick (agents/store_loop.py: 0.2 s, or ``--keepalive-s`` / 10 when shorter), once this
node's own end is sent, node 0 looks for every node's ``end/a/r`` (one ``check``) and,
  when all are in, publishes their distinct outcomes as ``outcomes/a``; any other node looks for
  that one key (its store loop reads ``fate/a`` too: one ``check``).

So a node other than the first makes one call per tick and two per beat (two per tick while it
waits for the others' ends), each of a few dozen bytes, however many nodes there are; node 0 the
same, its read of the counters about 20 bytes a node. A lost node is found by node 0,
which writes the attempt's fate ``lost`` and the lost node's end (no end will come from it): every
other node reads the fate at its next tick. A lost node 0 is found by every other node, by its
counter or by its store not answering (agents/store_loop.py's watchdog).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Protocol

WATCHER = 0  # the node rank that watches every other node's keep-alive (it hosts the store)
BEATS_PER_KEEPALIVE = 10  # beats (and reads of the counters) per --keepalive-s


class KeepAliveStore(Protocol):
    """The calls of agents/store.py's ``AgentStore`` made here."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> str: ...
    def has(self, keys: Sequence[str]) -> bool: ...
    def add(self, key: str, amount: int) -> int: ...
    def get_many(self, keys: Sequence[str]) -> list[str]: ...
    def get_counters(self, keys: Sequence[str]) -> list[str]: ...


def beat_key(rank: int) -> str:
    return f"hb/{rank}"


def end_key(attempt: int, rank: int) -> str:
    return f"end/{attempt}/{rank}"


def outcomes_key(attempt: int) -> str:
    return f"outcomes/{attempt}"


class KeepAlive:
    """One node's side, for one world (``nnodes`` nodes; this node is ``me``)."""

    def __init__(self, me: int, nnodes: int, keepalive_s: float, tick_s: float) -> None:
        self.me, self.nnodes = me, nnodes
        self.period_s = max(tick_s, keepalive_s / BEATS_PER_KEEPALIVE)
        self.silent_after_s = max(keepalive_s - 2 * self.period_s, tick_s)
        self.watched = [r for r in range(nnodes) if r != me] if me == WATCHER else [WATCHER]
        self._seen: dict[int, tuple[str, float]] = {}  # rank -> (its counter, when it last moved)
        self._next_s = 0.0

    def due(self, now: float) -> bool:
        """A beat (and a read of the counters) is due at ``now`` (monotonic); then the next one's time."""
        if now < self._next_s:
            return False
        self._next_s = now + self.period_s
        return True

    @property
    def is_watcher(self) -> bool:
        return self.me == WATCHER

    def beat(self, store: KeepAliveStore) -> None:
        store.add(beat_key(self.me), 1)

    def silent(self, store: KeepAliveStore, now: float) -> list[tuple[int, float]]:
        """The watched nodes whose counter has not moved for longer than ``silent_after_s``, each
        with how long (seconds)."""
        if not self.watched:
            return []
        if self.is_watcher:
            counters = store.get_counters([beat_key(r) for r in self.watched])
        else:
            counters = [str(store.add(beat_key(WATCHER), 0))]
        found = []
        for rank, counter in zip(self.watched, counters, strict=True):
            seen = self._seen.get(rank)
            if seen is None or seen[0] != counter:
                self._seen[rank] = (counter, now)
            elif now - seen[1] > self.silent_after_s:
                found.append((rank, now - seen[1]))
        return found

    def outcomes(self, store: KeepAliveStore, attempt: int) -> tuple[str, ...] | None:
        """Every node's end of ``attempt`` is in: their distinct outcomes (node 0 reads them and
        publishes them; the others read what it published), else None."""
        if self.is_watcher:
            ends = [end_key(attempt, r) for r in range(self.nnodes)]
            if not store.has(ends):
                return None
            distinct = sorted(set(store.get_many(ends)))
            store.set(outcomes_key(attempt), json.dumps(distinct))
            return tuple(distinct)
        key = outcomes_key(attempt)
        return tuple(json.loads(store.get(key))) if store.has([key]) else None
