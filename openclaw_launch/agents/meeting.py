"""The nodes' meeting, in the agent's helper process (agents/store_loop.py): node ranks by arrival,
each node admitted once, and the fingerprints compared. Blocking store calls; ``say`` puts a line on
the launcher's console.

Keys (``store.PREFIX`` + ...): ``arrivals`` (a counter: the clients' order of arrival),
``master_port`` (node rank 0's free port, the workers' MASTER_PORT, by arrival only), ``member/r``
(the launcher that holds node rank r: the first to claim it; a second is refused), ``fp/r`` and
``ack/r`` (the fingerprints, compared by every node).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence

from openclaw_launch.agents.fingerprint import differences
from openclaw_launch.agents.membership import ID_KEY, namespace
from openclaw_launch.agents.store import AgentError, AgentStore

WAIT_NOTE_S = 5.0  # a waiting launcher says what it waits for this often
_POLL_S = 0.1


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
    """Publish this node's fingerprint, wait for every node's (saying which are missing every
    ``WAIT_NOTE_S``), and compare: ``AgentError`` naming each difference."""
    n = len(nodes)
    store.set(f"hb/{me}", "0")
    store.set(f"fp/{me}", json.dumps({"node": name, "fingerprint": dict(fingerprint)}))
    start = time.monotonic()
    noted = start
    keys = [f"fp/{r}" for r in range(n)]
    while not store.has(keys):
        now = time.monotonic()
        if now - start > timeout_s or now - noted >= WAIT_NOTE_S:
            missing = [nodes[r] for r in range(n) if not store.has([f"fp/{r}"])]
            if now - start > timeout_s:
                raise AgentError(
                    f"node(s) {', '.join(missing)} never arrived: waited {timeout_s:g} s at "
                    f"{store.addr}:{store.port} (--agent-timeout-s); started nothing"
                )
            noted = now
            say(
                f"waiting for node(s) {', '.join(missing)} ({n - len(missing)} of {n} here) at "
                f"{store.addr}:{store.port}: {timeout_s - (now - start):.0f} s left (--agent-timeout-s)"
            )
        time.sleep(_POLL_S)
    prints = {}
    for text in store.get_many(keys):
        data = json.loads(text)
        prints[data["node"]] = data["fingerprint"]
    store.set(f"ack/{me}", "1")
    diff = differences(prints)
    if store.is_host:  # keep the store up until every node has read the fingerprints
        acks = [f"ack/{r}" for r in range(n)]
        until = time.monotonic() + min(timeout_s, 30.0)
        while not store.has(acks) and time.monotonic() < until:
            time.sleep(0.05)
    if diff.warned:
        say("warning: the nodes differ where that only warns (docs/multinode.md):\n  " + "\n  ".join(diff.warned))
    if diff.refused:
        raise AgentError("the nodes do not agree; started nothing on any node:\n  " + "\n  ".join(diff.refused))
