"""The nodes' meeting, in the agent's helper process (agents/store_loop.py): node ranks by arrival,
each node admitted once, and the fingerprints compared. Blocking store calls; ``say`` puts a line on
the launcher's console.

Keys (``store.PREFIX`` + ...): ``arrivals`` (a counter: the clients' order of arrival),
``master_port`` (node rank 0's free port, the workers' MASTER_PORT, by arrival only), ``member/r``
(the launcher that holds node rank r: the first to claim it; a second is refused), ``fp/r`` (node
r's fingerprint), ``verdict`` (node rank 0's comparison of them all), ``waiting`` (node 0's last
note of the missing nodes) and ``acks`` (a counter: the nodes that read the verdict).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openclaw_launch.agents.fingerprint import differences
from openclaw_launch.agents.membership import ID_KEY, namespace
from openclaw_launch.agents.store import AgentError, AgentStore

WAIT_NOTE_S = 5.0  # a waiting launcher says what it waits for this often
_POLL_S = 0.1
_PRINTS_PER_READ = 64  # node 0 reads the fingerprints this many at a time
_NAMES_SHOWN = 16  # the missing nodes a waiting line names (then how many more)


def launcher_token() -> str:
    """This launcher, as a node's holder: host, pid and a random part (a pid is reused)."""
    return f"{socket.gethostname()} pid {os.getpid()} #{uuid.uuid4().hex[:8]}"


def arrive(store: AgentStore, nnodes: int, token: str, master_port: int, rdzv_id: str = "none") -> tuple[int, int]:
    """This launcher's node rank and the workers' MASTER_PORT. The store's host is node rank 0
    (nobody arrives before its store listens) and publishes its ``--rdzv-id`` and free
    ``master_port``; every other launcher of the same id takes the next rank in order of arrival
    (another id, another job's launcher, is refused before it takes one). A launcher past ``nnodes``
    is refused."""
    if store.is_host:
        rank = 0
        store.set("rdzv_id", rdzv_id)
        store.set("master_port", str(master_port))
    else:
        if store.has([ID_KEY]):  # agents/elastic.py's: its first node runs --nnodes MIN:MAX
            rdzv_id = store.get(ID_KEY)
            raise AgentError(
                f"the job at {store.addr}:{store.port} is elastic (--nnodes {store.get(namespace(rdzv_id) + 'spec')}, "
                f"--rdzv-id {rdzv_id}): give every node the same --nnodes; started nothing"
            )
        theirs = store.get("rdzv_id")  # the host sets it first (a get waits for it)
        if theirs != rdzv_id:
            raise AgentError(
                f"--rdzv-id {rdzv_id}, but the job at {store.addr}:{store.port} is --rdzv-id {theirs}: another "
                "job's rendezvous (give each job its own endpoint, or this job's id); that job is untouched, "
                "started nothing"
            )
        rank = store.add("arrivals", 1)
        if rank >= nnodes:
            raise AgentError(
                f"the job at {store.addr}:{store.port} has its {nnodes} node(s) already (node ranks by arrival): "
                "this launcher is one too many and is refused (a second launcher on a node?); "
                "the running job is untouched, started nothing"
            )
    admit(store, rank, f"node{rank}", token)
    return rank, int(store.get("master_port"))


def admit(store: AgentStore, me: int, name: str, token: str) -> None:
    """Claim node rank ``me`` for this launcher; one that another launcher holds is refused, before
    this one writes anything else (the job that runs is untouched)."""
    holder = store.first(f"member/{me}", token)
    if holder != token:
        raise AgentError(
            f"node {name} (node rank {me}) already joined this job (its launcher: {holder.split(' #')[0]}): "
            "a second launcher for it is refused; the running job is untouched, started nothing"
        )


def meet(
    store: AgentStore,
    me: int,
    name: str,
    nodes: Sequence[str],
    fingerprint: Mapping[str, str],
    timeout_s: float,
    say: Callable[[str], None],
) -> None:
    """Publish this node's fingerprint; node rank 0 waits for every node's (saying which are missing
    every ``WAIT_NOTE_S``), compares them and publishes the verdict; every other node waits for that
    verdict alone. Either way ``AgentError`` names each difference, or the nodes that never came.

    Only node 0 reads every node's fingerprint (about 2 kB each): when every node read every one,
    the store sent N times N of them (36 MB at 128 nodes, 150 GB at 8 192; issue 29)."""
    store.set_counter(f"hb/{me}", 0)
    store.set(f"fp/{me}", json.dumps({"node": name, "fingerprint": dict(fingerprint)}))
    verdict = _compare(store, nodes, timeout_s, say) if me == 0 else _verdict(store, len(nodes), timeout_s, say)
    if verdict.get("warned"):
        say("warning: the nodes differ where that only warns (docs/multinode.md):\n  " + "\n  ".join(verdict["warned"]))
    if verdict.get("never"):
        raise AgentError(verdict["never"])
    if verdict.get("refused"):
        raise AgentError("the nodes do not agree; started nothing on any node:\n  " + "\n  ".join(verdict["refused"]))


def _compare(store: AgentStore, nodes: Sequence[str], timeout_s: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Node 0: every node's fingerprint (one ``check`` of them all a poll), compared; the verdict,
    published. After ``--agent-timeout-s`` the verdict names the nodes that never came."""
    n = len(nodes)
    keys = [f"fp/{r}" for r in range(n)]
    start = noted = time.monotonic()
    seen: set[int] = set()  # the nodes whose fingerprint is known to be there (checked one by one at a note)
    while not store.has(keys):
        now = time.monotonic()
        if now - start > timeout_s or now - noted >= WAIT_NOTE_S:
            seen |= {r for r in range(n) if r not in seen and store.has([keys[r]])}
            missing = _names([nodes[r] for r in range(n) if r not in seen])
            if now - start > timeout_s:
                text = (
                    f"node(s) {missing} never arrived: waited {timeout_s:g} s at {store.addr}:{store.port} "
                    "(--agent-timeout-s); started nothing"
                )
                return _published(store, {"never": text}, len(seen) - 1, timeout_s)
            noted = now
            left = f"{timeout_s - (now - start):.0f} s left (--agent-timeout-s)"
            store.set("waiting", json.dumps({"missing": missing, "here": len(seen)}))
            say(f"waiting for node(s) {missing} ({len(seen)} of {n} here) at {store.addr}:{store.port}: {left}")
        time.sleep(_POLL_S)
    prints = {}
    for i in range(0, n, _PRINTS_PER_READ):
        for text in store.get_many(keys[i : i + _PRINTS_PER_READ]):
            data = json.loads(text)
            prints[data["node"]] = data["fingerprint"]
    diff = differences(prints)
    return _published(store, {"warned": diff.warned, "refused": diff.refused}, n - 1, timeout_s)


def _published(store: AgentStore, verdict: dict[str, Any], readers: int, timeout_s: float) -> dict[str, Any]:
    """Node 0's ``verdict``, kept up until ``readers`` nodes have read it (``acks``), 30 s at most."""
    store.set("verdict", json.dumps(verdict))
    until = time.monotonic() + min(timeout_s, 30.0)
    while store.add("acks", 0) < readers and time.monotonic() < until:
        time.sleep(0.05)
    return verdict


def _verdict(store: AgentStore, n: int, timeout_s: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Any node but the first: node 0's verdict (one ``check`` a poll), acknowledged. Node 0 gives its
    own after ``--agent-timeout-s`` at the latest; a node that has none ``WAIT_NOTE_S`` later is on its
    own."""
    start = noted = time.monotonic()
    where = f"{store.addr}:{store.port}"
    while not store.has(["verdict"]):
        now = time.monotonic()
        if now - start > timeout_s + WAIT_NOTE_S:
            raise AgentError(
                f"the first node gave no verdict on the nodes' fingerprints within {timeout_s:g} s at {where} "
                "(--agent-timeout-s); started nothing"
            )
        if now - noted >= WAIT_NOTE_S:
            noted = now
            left = f"{max(timeout_s - (now - start), 0):.0f} s left (--agent-timeout-s)"
            if store.has(["waiting"]):
                note = json.loads(store.get("waiting"))
                say(f"waiting for node(s) {note['missing']} ({note['here']} of {n} here) at {where}: {left}")
            else:
                say(f"waiting for the first node to compare the nodes' fingerprints at {where}: {left}")
        time.sleep(_POLL_S)
    verdict: dict[str, Any] = json.loads(store.get("verdict"))
    store.add("acks", 1)
    return verdict


def _names(names: Sequence[str]) -> str:
    """Node names for a line: the first ``_NAMES_SHOWN``, then how many more."""
    shown = ", ".join(names[:_NAMES_SHOWN])
    return shown if len(names) <= _NAMES_SHOWN else f"{shown} and {len(names) - _NAMES_SHOWN} more"
