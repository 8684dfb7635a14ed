"""Which node pairs a preflight measures together: a round-robin tournament (the circle method).

Every pair of nodes meets exactly once; the pairs of one round are disjoint (no node is in two), so
a round's pairs run at the same time without sharing a node's links. N nodes take N - 1 rounds when
N is even and N rounds when N is odd (one node sits each round out): the fewest rounds that can hold
N (N - 1) / 2 disjoint pairs, instead of N (N - 1) / 2 pair tests one after another. Pure.
"""

from __future__ import annotations


def round_robin(nodes: int) -> list[list[tuple[int, int]]]:
    """The rounds of pairs ``(a, b)``, ``a < b``, of node indexes ``0 .. nodes - 1``."""
    if nodes < 2:
        return []
    seats = list(range(nodes)) + ([None] if nodes % 2 else [])  # None: the seat that sits out
    rounds = []
    for _ in range(len(seats) - 1):
        half = len(seats) // 2
        pairs = [(seats[i], seats[-1 - i]) for i in range(half)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]  # seat 0 stays, the others turn one place
    return rounds


def pair_name(a: str, b: str) -> str:
    """``pair:node0,node3``: the two nodes' names, in node-rank order."""
    return f"pair:{a},{b}"
