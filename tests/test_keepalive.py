"""The keep-alive's cost per node does not grow with the job (issue 29, agents/keepalive.py): on a
real TCPStore (the first node's, hosted here) and the standard-library client every other node
uses, a node other than the first makes the same calls of the same bytes at 8 and at 128 nodes;
only the first node's read of the counters grows, by one key a node. The first node finds a silent
node, any other node finds a silent first node, and the distinct end outcomes are the first node's
to publish. Times are given to the calls (``now``), never waited for."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import pytest
from host import free_port, needs_torch

from openclaw_launch.agents.keepalive import KeepAlive, beat_key, end_key, outcomes_key
from openclaw_launch.agents.store import AgentStore

pytestmark = needs_torch
KEEPALIVE_S, TICK_S = 15.0, 0.2


class Counted:
    """A store that counts the calls made on it and the bytes of their keys and values."""

    def __init__(self, store: AgentStore) -> None:
        self.store, self.calls, self.bytes = store, 0, 0

    def _count(self, *parts: str) -> None:
        self.calls += 1
        self.bytes += sum(len(p) for p in parts)

    def set(self, key: str, value: str) -> None:
        self._count(key, value)
        self.store.set(key, value)

    def get(self, key: str) -> str:
        value = self.store.get(key)
        self._count(key, value)
        return value

    def has(self, keys: Sequence[str]) -> bool:
        self._count(*keys)
        return self.store.has(keys)

    def add(self, key: str, amount: int) -> int:
        self._count(key)
        return self.store.add(key, amount)

    def get_many(self, keys: Sequence[str]) -> list[str]:
        values = self.store.get_many(keys)
        self._count(*keys, *values)
        return values

    def get_counters(self, keys: Sequence[str]) -> list[str]:
        values = self.store.get_counters(keys)
        self._count(*keys, *values)
        return values


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[AgentStore, AgentStore]]:
    """The first node's store (hosted here) and another node's client of it."""
    port = free_port()
    host = AgentStore("127.0.0.1", port, True, 10.0)
    yield host, AgentStore("127.0.0.1", port, False, 10.0)


def world(host: AgentStore, scope: str, nnodes: int) -> AgentStore:
    """A world of ``nnodes`` nodes whose counters are set (agents/meeting.py sets them at 0)."""
    scoped = host.within(scope)
    for rank in range(nnodes):
        scoped.set_counter(beat_key(rank), 0)
    return scoped


def one_tick(watch: KeepAlive, store: Counted, attempt: int, now: float) -> None:
    assert watch.due(now)
    watch.beat(store)
    watch.silent(store, now)
    watch.outcomes(store, attempt)


def test_a_node_but_the_first_pays_the_same_at_8_and_128_nodes(stores: tuple[AgentStore, AgentStore]) -> None:
    host, client = stores
    cost = {}
    for nnodes in (8, 128):
        world(host, f"cost{nnodes}/", nnodes)
        other, first = Counted(client.within(f"cost{nnodes}/")), Counted(host.within(f"cost{nnodes}/"))
        one_tick(KeepAlive(5, nnodes, KEEPALIVE_S, TICK_S), other, 0, 0.0)
        one_tick(KeepAlive(0, nnodes, KEEPALIVE_S, TICK_S), first, 0, 0.0)
        cost[nnodes] = (other.calls, other.bytes, first.calls, first.bytes)
    assert cost[8][:2] == cost[128][:2]  # calls and bytes of a node other than the first: flat
    assert cost[8][2] == cost[128][2] and cost[8][3] < cost[128][3]  # the first node: one read, a key a node


def test_the_first_node_finds_a_silent_node_and_the_others_a_silent_first_node(
    stores: tuple[AgentStore, AgentStore],
) -> None:
    host, client = stores
    scoped = world(host, "silent/", 4)
    first, other = KeepAlive(0, 4, KEEPALIVE_S, TICK_S), KeepAlive(2, 4, KEEPALIVE_S, TICK_S)
    mine = client.within("silent/")
    assert first.silent(scoped, 0.0) == [] and other.silent(mine, 0.0) == []
    for rank in (1, 2):  # node 3 never beats again; node 0 neither, from the others' side
        scoped.add(beat_key(rank), 1)
    later = first.silent_after_s + 0.1
    assert [rank for rank, _ in first.silent(scoped, later)] == [3]
    assert [rank for rank, _ in other.silent(mine, later)] == [0]
    assert first.silent_after_s <= KEEPALIVE_S - first.period_s  # found within --keepalive-s of the last beat


def test_the_first_node_publishes_the_distinct_outcomes_once_every_end_is_in(
    stores: tuple[AgentStore, AgentStore],
) -> None:
    host, client = stores
    scoped, mine = world(host, "ends/", 3), client.within("ends/")
    first, other = KeepAlive(0, 3, KEEPALIVE_S, TICK_S), KeepAlive(1, 3, KEEPALIVE_S, TICK_S)
    scoped.set(end_key(0, 0), "ok")
    scoped.set(end_key(0, 1), "signal")
    assert first.outcomes(scoped, 0) is None and other.outcomes(mine, 0) is None
    scoped.set(end_key(0, 2), "ok")
    assert other.outcomes(mine, 0) is None  # the first node has not published them yet
    assert first.outcomes(scoped, 0) == ("ok", "signal")
    assert other.outcomes(mine, 0) == ("ok", "signal")
    assert json.loads(scoped.get(outcomes_key(0))) == ["ok", "signal"]
