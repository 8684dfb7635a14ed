"""The rank's pty width as rich sees it (issue 31 item 6): rich measures stdin (the user's terminal)
before stdout, and a rank's pty is the window less the rank prefix, so the launcher gives a rank
with a pty ``COLUMNS``/``LINES`` of its pty (run/terminal.py's ``size_env``): rich draws at the
rank's console width, not 9 columns wider. The launcher runs on a real pty (tests/test_terminal.py's
``OnTerminal``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_terminal import PREFIX_COLUMNS, OnTerminal

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "tests" / "rich_width_worker.py")


@pytest.mark.parametrize(("prefix", "columns"), [((), 101 - PREFIX_COLUMNS), (("--prefix", ""), 101)])
def test_rich_draws_at_the_ranks_pty_width(tmp_path: Path, prefix: tuple[str, ...], columns: int) -> None:
    line = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", *prefix, "--no-python"]
    term = OnTerminal([*line, sys.executable, WORKER, str(tmp_path)], rows=33, columns=101)
    assert term.finish() == 0, term.text()
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert seen == [{"rich": columns, "stdout": columns}] * 2
