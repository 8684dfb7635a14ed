"""The suite's own temporary files stay in a directory of its own, and go with it.

torchrun keeps ``/tmp/torchelastic_*`` after every job, and a launcher given ``-r/-t`` without
``--log-dir`` keeps the logs it wrote in a temporary directory (both on purpose, for the user). So
every process the tests start gets a ``TMPDIR`` of the session's own, removed at the end: the test
command leaves ``/tmp`` as it found it. Under pytest-xdist each worker is a session of its own, with
its own ``TMPDIR``, so the jobs of one worker's tests never see the other's (tests/test_launch_e2e.py's
MPS check relies on it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from guards import wait_for

from openclaw_launch.agents.served_store import SERVER_ENV


@pytest.fixture(scope="session", autouse=True)
def session_tmpdir() -> Iterator[Path]:
    """Directly in the temp directory the session was given, not under pytest's base directory: a
    unix socket path under it (an MPS pipe directory's) must fit in 108 bytes, and pytest's base is 45
    characters deep under xdist (``pytest-of-USER/pytest-N/popen-gwK``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = Path(tempfile.mkdtemp(prefix=f"openclaw-tests-{worker}-"))
    saved_env, saved_module = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = str(path)  # the tests' own gettempdir() agrees with the launchers'
    try:
        yield path
    finally:
        tempfile.tempdir = saved_module
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def agent_store_server(session_tmpdir: Path) -> Iterator[str]:
    """The process that holds the agents' stores of the tests that take ``served_agent_stores``
    (openclaw_launch/agents/served_store.py), started when the first one runs; its log is
    agent-stores.log in the session's directory."""
    path = session_tmpdir / "agent-stores.sock"
    with open(session_tmpdir / "agent-stores.log", "w") as log:
        command = [sys.executable, "-m", "openclaw_launch.agents.served_store", str(path)]
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        wait_for(lambda: path.exists() or server.poll() is not None, "the agents' store server never listened")
        assert server.poll() is None, (session_tmpdir / "agent-stores.log").read_text()
        yield str(path)
    finally:
        server.terminate()
        server.wait()


@pytest.fixture
def served_agent_stores(agent_store_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launchers this test starts keep their agents' stores in the session's store server, so
    that their helpers never import torch (about 2 s of CPU each): for the tests of what the agents
    do over the store. The store's own behaviour (who hosts it, reaching it, a host that is frozen
    or gone) is tested with the store in the helper."""
    monkeypatch.setenv(SERVER_ENV, agent_store_server)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``torchrun_live`` tests run only when ``-m`` names them (``pytest -m torchrun_live``): a
    plain run, or one of ``-m "not serial"``, compares with torchrun's recording instead."""
    if "torchrun_live" in (config.getoption("markexpr") or ""):
        return
    live = [item for item in items if item.get_closest_marker("torchrun_live")]
    if live:
        config.hook.pytest_deselected(items=live)
        items[:] = [item for item in items if not item.get_closest_marker("torchrun_live")]
