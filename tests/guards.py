"""The one guard on every wait of the tests, and the waits that use it.

A guard stops a test that is stuck; it never measures (speed is asserted in ``benchmarks/`` only).
So it is generous: on a 2-core machine running the suite on both cores, with other work beside
it, every healthy wait ends well inside it. pytest-timeout's per-test ceiling (pyproject.toml)
stays above it, so a stuck wait fails here, naming what it waited for, before the ceiling hits.
Importable from the tests' child processes too (``tests/`` is their script directory).
"""

from __future__ import annotations

import select
import subprocess
import time
from collections.abc import Callable
from typing import IO, TypeVar

GUARD_S = 90.0

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str | Callable[[], str], poll_s: float = 0.02) -> T:
    """Poll ``predicate`` until it returns a true value, and return that value; after GUARD_S, fail
    with ``what`` (or what the callable ``what`` says then: the output seen so far, say)."""
    deadline = time.monotonic() + GUARD_S
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what() if callable(what) else what} (waited {GUARD_S:g} s)")
        time.sleep(poll_s)
    return value


def read_until(proc: subprocess.Popen[str], text: str, stream: IO[str] | None = None) -> str:
    """A process's stream (its stderr unless told), line by line, up to and with the line that holds
    ``text``; fails if the process ends first or nothing says it within GUARD_S."""
    stream = stream or proc.stderr
    assert stream is not None
    seen = ""
    deadline = time.monotonic() + GUARD_S
    while text not in seen:
        assert time.monotonic() < deadline, f"never said {text!r} (waited {GUARD_S:g} s): {seen}"
        if select.select([stream], [], [], 1.0)[0]:
            line = stream.readline()
            assert line, f"ended (exit {proc.wait()}) before saying {text!r}: {seen}"
            seen += line
    return seen
