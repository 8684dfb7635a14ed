"""torchrun's side of the comparisons with torchrun, recorded once per torch version.

Every comparison runs openclaw-launch itself. torchrun's side changes only with torch, and each
torchrun launch costs torch's import (about 2.8 s of CPU), so it is read from
``tests/data/torchrun-<torch version>.json``: what the test reads of torchrun's run, with this
run's ports and directories as placeholders. Each case runs against that recording (side
``recorded``) and, under the ``torchrun_live`` marker, against torchrun itself (side ``live``;
``pytest -m torchrun_live``, deselected otherwise by tests/conftest.py); a few representative cases
run against torchrun itself in every run. A case the recording lacks (a new case, another torch
version) fails with the command that records it: with ``OPENCLAW_RECORD_TORCHRUN=1`` every selected
case runs torchrun and writes what it saw into the recording (one writer at a time: pytest-xdist's
workers take a lock).
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import pytest

RECORD_ENV = "OPENCLAW_RECORD_TORCHRUN"
DATA = Path(__file__).resolve().parent / "data"
RECORDING_TESTS = (
    "tests/test_torchrun_compat.py tests/test_compat_behaviour.py tests/test_terminal.py "
    "tests/test_agents_membership.py"
)

#: One comparison's sides: the recording in every run, torchrun itself under the marker.
SIDES = [pytest.param("recorded", id="recorded"), pytest.param("live", id="live", marks=pytest.mark.torchrun_live)]


def case_sides(cases: Iterable[str], live_every_run: Collection[str] = ()) -> list[Any]:
    """``(case, side)`` parameters (``pytest.param``) for each case: its recorded and live sides, or
    for the cases of ``live_every_run`` the live side alone, in every run."""
    params = []
    for case in sorted(cases):
        if case in live_every_run:
            params.append(pytest.param(case, "live", id=f"{case}-live"))
        else:
            params.append(pytest.param(case, "recorded", id=f"{case}-recorded"))
            params.append(pytest.param(case, "live", id=f"{case}-live", marks=pytest.mark.torchrun_live))
    return params


def torchrun_side(key: str, side: str, run: Callable[[], Any]) -> Any:
    """torchrun's result for ``key``: ``run()`` (which runs torchrun and returns what the test reads
    of it, as JSON) on the live side and while recording, else the recording's."""
    recording = _recording_path()
    if side == "live" or os.environ.get(RECORD_ENV) == "1":
        result = json.loads(json.dumps(run()))  # as the recording gives it back: lists, string keys
        if os.environ.get(RECORD_ENV) == "1":
            _record(recording, key, result)
        return result
    results = json.loads(recording.read_text())["results"] if recording.exists() else {}
    if key not in results:
        test = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
        pytest.fail(
            f"{recording.name} has no {key!r} (torch {importlib.metadata.version('torch')}): record it with "
            f"{RECORD_ENV}=1 python -m pytest -p no:cacheprovider '{test}' (every case: {RECORDING_TESTS})"
        )
    return results[key]


def _recording_path() -> Path:
    version = importlib.metadata.version("torch").split("+")[0]  # the local build (+cpu, +cu128) aside
    return DATA / f"torchrun-{version}.json"


def _record(path: Path, key: str, result: Any) -> None:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read()
        document = json.loads(text) if text else {"torch": importlib.metadata.version("torch"), "results": {}}
        document["results"][key] = result
        f.seek(0)
        f.truncate()
        f.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
