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
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from guards import wait_for

from openclaw_launch.agents.served_store import SERVER_ENV


def pytest_configure(config: pytest.Config) -> None:
    """A suite started from a background job (``cmd &`` in a script) inherits SIGINT ignored, and
    every launcher it starts would inherit that too and rightly keep it ignored (as ``nohup`` jobs
    expect). The signal tests are about a launcher whose SIGINT is live: catching it here makes
    every child start with the default disposition (exec resets caught signals, not ignored ones)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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


class AgentStoreServer:
    """The process that holds the agents' stores of the tests that take ``served_agent_stores``
    (openclaw_launch/agents/served_store.py); its log is agent-stores.log in the session's directory.

    Started again when gone: a test that runs ``supervise()`` in this process kills at its end every
    descendant of this process it does not exempt, as the launcher does, and the server is one (a
    served test after such a test found no server: every elastic test failed).
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / "agent-stores.sock"
        self.log = directory / "agent-stores.log"
        self.process: subprocess.Popen[bytes] | None = None

    def running(self) -> str:
        """The server's socket path, the server started first if it is not running."""
        if self.process is None or self.process.poll() is not None:
            self.path.unlink(missing_ok=True)  # a killed server's socket file
            with open(self.log, "a") as log:
                command = [sys.executable, "-m", "openclaw_launch.agents.served_store", str(self.path)]
                server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self.process = server
            wait_for(lambda: self.path.exists() or server.poll() is not None, "the agents' store server never listened")
            assert server.poll() is None, self.log.read_text()
        return str(self.path)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait()


@pytest.fixture(scope="session")
def agent_store_server(session_tmpdir: Path) -> Iterator[AgentStoreServer]:
    server = AgentStoreServer(session_tmpdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def served_agent_stores(agent_store_server: AgentStoreServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launchers this test starts keep their agents' stores in the session's store server, so
    that their helpers never import torch (about 2 s of CPU each): for the tests of what the agents
    do over the store. The store's own behaviour (who hosts it, reaching it, a host that is frozen
    or gone) is tested with the store in the helper."""
    monkeypatch.setenv(SERVER_ENV, agent_store_server.running())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``torchrun_live`` tests run only when ``-m`` names them (``pytest -m torchrun_live``): a
    plain run, or one of ``-m "not serial"``, compares with torchrun's recording instead."""
    if "torchrun_live" in (config.getoption("markexpr") or ""):
        return
    live = [item for item in items if item.get_closest_marker("torchrun_live")]
    if live:
        config.hook.pytest_deselected(items=live)
        items[:] = [item for item in items if not item.get_closest_marker("torchrun_live")]
