"""The tables of docs/failures.md, rendered from the failure classes and the exit codes.

Each table follows a marker ``<!-- table: NAME -->`` and ends at the first line that is not a table
row. ``python -m openclaw_launch.run.failure_docs [--write]`` says whether the file differs (or
rewrites it); tests/test_failure_class.py holds the file to the tables.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from openclaw_launch.run.exit_codes import exit_codes_markdown
from openclaw_launch.run.failure_class import classes_markdown

DOCS_FILE = Path(__file__).resolve().parents[2] / "docs" / "failures.md"
TABLES: dict[str, Callable[[], str]] = {"failure classes": classes_markdown, "exit codes": exit_codes_markdown}
_MARKER = re.compile(r"^<!-- table: (?P<name>.+?) -->\n(?:\|.*\n)*", re.MULTILINE)


def update(text: str) -> str:
    """``text`` with every marked table rendered afresh."""
    return _MARKER.sub(lambda m: f"<!-- table: {m['name']} -->\n{TABLES[m['name']]()}", text)


def main(argv: list[str]) -> int:
    text = DOCS_FILE.read_text()
    fresh = update(text)
    if "--write" in argv:
        DOCS_FILE.write_text(fresh)
    elif fresh != text:
        print(f"{DOCS_FILE}: tables differ from the failure classes and exit codes; run with --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
