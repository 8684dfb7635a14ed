"""Issue 32 item 9: a stopping signal at any time of the launcher's start is the launcher's (exit
128+N, one line, no traceback), from as early as the platform allows.

Under the console script and ``python -m`` the handlers go in right after the interpreter's ``site``
import, before any other module loads; with ``python3 -S .../openclaw_launch/__main__.py`` (the
container's ENTRYPOINT) before ``site`` too. What is left (the interpreter's own start) is measured
in benchmarks/signal_window.py, not here: no test asserts a time.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S
from host import signal_pid1_once_caught

ROOT = Path(__file__).resolve().parent.parent
ENTRY = str(ROOT / "openclaw_launch" / "__main__.py")

SITE_SPY = """
import signal
print("handled at site:", signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), flush=True)
"""


def test_the_entry_point_loads_nothing_before_its_handlers() -> None:
    """The package and startup.py import no module from disk (no typing, signal, enum, threading):
    with ``-S`` nothing else has loaded them, as in a plain virtualenv."""
    code = (
        "import sys; before = set(sys.modules); import openclaw_launch.startup; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=GUARD_S)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["__future__", "openclaw_launch", "openclaw_launch.startup"], p.stdout


@pytest.mark.parametrize(
    ("entry", "before_site"),
    [(["-S", ENTRY], True), (["-m", "openclaw_launch"], False)],
    ids=["dash-S-by-path", "module"],
)
def test_the_handlers_are_in_before_site_only_with_dash_s(tmp_path: Path, entry: list[str], before_site: bool) -> None:
    """A ``sitecustomize`` (the last thing ``site`` runs) sees SIGTERM handled with ``-S``, and the
    launcher still finds its site-packages (click) and runs; under ``-m`` site runs first (the
    window docs/container.md gives)."""
    (tmp_path / "sitecustomize.py").write_text(SITE_SPY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}  # the spy first
    p = subprocess.run(
        [sys.executable, *entry, "--nproc-per-node", "1", "--no-python", "true"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=GUARD_S,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == f"handled at site: {before_site}", p.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (a PID namespace)"
)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_as_soon_as_pid_1_catches_it_before_site(sig: int, tmp_path: Path) -> None:
    """As PID 1 started as the container's ENTRYPOINT is: the first moment SIGTERM is caught is
    before site; a signal then ends the launcher with 128+N, no traceback (and is not dropped: the
    job's ``sleep 60`` would end it 0)."""
    code, output = signal_pid1_once_caught(
        [sys.executable, "-S", ENTRY, "--nproc-per-node", "1", "--no-python", "sleep", "60"], sig, cwd=tmp_path
    )
    assert code == 128 + sig, output
    assert "Traceback" not in output, output
