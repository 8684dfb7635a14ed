"""A worker that writes the width rich would draw at (rich.console.Console().width where rich is
installed; else rich's rule: ``COLUMNS`` when it is a number, else the first of stdin, stdout and
stderr that reports a terminal size) and its stdout's terminal width, to OUT/rank-<RANK>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def rich_width() -> int:
    try:
        from rich.console import Console
    except ImportError:
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit():
            return int(columns)
        for fd in (0, 1, 2):  # rich's _STD_STREAMS, in its order
            try:
                return os.get_terminal_size(fd).columns
            except OSError:
                continue
        return 80
    return int(Console().width)


out = Path(sys.argv[1])
seen = {"rich": rich_width(), "stdout": os.get_terminal_size(1).columns if sys.stdout.isatty() else None}
(out / f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(seen))
