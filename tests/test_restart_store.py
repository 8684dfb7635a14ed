"""A restart's workers' store is ready before they come (issue 33; agents/worker_store.py): after an
attempt whose workers opened the store, the next attempt's helper makes its store at once, without
a connection; an attempt whose workers never opened it leaves the next one lazy (no torch import
for a job that needs no store). Real helpers and a real socket; the helper's own torch import."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any, cast

from guards import wait_for
from host import free_port, needs_torch

from openclaw_launch.agents.worker_store import WorkerStore

pytestmark = needs_torch


def ranks(port: int) -> Any:
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_RANK": "0", "MASTER_PORT": str(port)}
    return cast(Any, (SimpleNamespace(env=env, gpu_uuid=None),))  # a CPU rank: lazy unless a restart


def made(store: WorkerStore) -> bool:
    store._read()
    return store._used


def test_the_store_of_a_restart_is_made_before_its_workers_connect() -> None:
    store, port = WorkerStore(lambda text: None), free_port()
    try:
        store.begin_ranks(0, ranks(port))
        assert not made(store)  # lazy: nobody came yet
        with socket.create_connection(("127.0.0.1", port)):  # a worker opens it: the helper makes the store
            wait_for(lambda: made(store), "the first attempt's store was never made")
        store.end_attempt(0)
        store.begin_ranks(1, ranks(port))
        store._used = False  # what follows is attempt 1's helper alone
        wait_for(lambda: made(store), "the restart's store was not made before any connection")
    finally:
        store.close()


def test_a_job_whose_workers_never_opened_it_stays_lazy() -> None:
    store, port = WorkerStore(lambda text: None), free_port()
    try:
        store.begin_ranks(0, ranks(port))
        store.end_attempt(0)
        store.begin_ranks(1, ranks(port))
        assert store._helper is not None and not made(store)
    finally:
        store.close()
