"""Generated tables in the docs, one rule for every generated file: a table follows a marker line
``<!-- table: NAME -->`` and ends at the first line that is not a table row; ``python -m tools.NAME
[--write]`` says whether a file differs from its sources (exit 1) or rewrites it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

MARKER = re.compile(r"^<!-- table: (?P<name>.+?) -->\n(?P<table>(?:\|.*\n)*)", re.MULTILINE)


def update_tables(text: str, render: Callable[[str], str]) -> str:
    """``text`` with every marked table rendered afresh by ``render(name)``."""
    return MARKER.sub(lambda m: f"<!-- table: {m['name']} -->\n{render(m['name'])}", text)


def marked_tables(text: str) -> list[str]:
    """The table names marked in ``text``, in order."""
    return [m["name"] for m in MARKER.finditer(text)]


def check_or_write(path: Path, render: Callable[[str], str], sources: str, write: bool) -> int:
    """The docs command: rewrite ``path`` (``write``), else 1 and a line when it differs."""
    text = path.read_text()
    fresh = update_tables(text, render)
    if write:
        path.write_text(fresh)
    elif fresh != text:
        print(f"{path}: tables differ from {sources}; run with --write")
        return 1
    return 0
