"""The command line run in the test's own process, for the cases that only check a usage error
(exit 2, one message, nothing started): an interpreter start-up costs about 0.4 s of CPU, a click
invocation a few milliseconds.

``invoke`` goes through the entry point's own handling of errors (``cli/main._guarded_main``: the
one-line messages, the exit codes), less what only a process of its own has: the start-up signal
handlers of ``startup.py`` (they matter only for a signal, and nothing has started when a usage
error is found) and ``_exit_now``'s ``os._exit``. Each family of errors keeps one case through the
real entry point (``python -m openclaw_launch``), so that path stays proven.

What an invocation changes in this process is put back: the environment, the working directory,
``sys.argv``, the signal handlers and the ports ``plan/context.free_port`` holds. An exception
other than ``SystemExit`` is not caught: the test fails with its traceback, where the real entry
point would have printed one.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from openclaw_launch.cli.main import _guarded_main
from openclaw_launch.plan import context

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Invocation:
    """What a test reads of a launcher process (``subprocess.CompletedProcess``'s names)."""

    returncode: int
    stdout: str
    stderr: str


def invoke(*args: str, env: Mapping[str, str] | None = None, cwd: Path = ROOT) -> Invocation:
    """``openclaw-launch ARGS...`` in this process, in ``cwd``. ``env``, as for ``subprocess.run``:
    the whole environment (None: this process's)."""
    overrides: dict[str, str | None] = {}
    if env is not None:
        overrides = {name: None for name in os.environ if name not in env}
        overrides.update(env)
    with _restored_process_state(cwd), CliRunner().isolation(env=overrides) as (stdout, stderr, _):
        sys.argv = ["openclaw-launch", *args]
        try:
            _guarded_main()
            code: object = 0
        except SystemExit as e:
            code = 0 if e.code is None else e.code
        sys.stdout.flush()
        sys.stderr.flush()
        assert isinstance(code, int), f"exit with {code!r}, not a status"
        return Invocation(code, stdout.getvalue().decode(), stderr.getvalue().decode())


@contextmanager
def _restored_process_state(cwd: Path) -> Iterator[None]:
    """``cwd`` for the invocation; then this process's working directory, ``sys.argv``, environment
    (click's isolation undoes only its ``env``) and signal handlers as they were, and the ports the
    invocation's ``free_port`` held let go (plan/context holds them until the process exits)."""
    argv, before, environ = sys.argv, Path.cwd(), dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in signal.valid_signals()}
    held = list(context._held_ports)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)
        sys.argv = argv
        if os.environ != environ:
            os.environ.clear()
            os.environ.update(environ)
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) != handler:
                signal.signal(sig, handler)
        for holder in [h for h in context._held_ports if h not in held]:
            context.release_port(holder.getsockname()[1])
