"""The tables of docs/failures.md, rendered from the failure classes and the exit codes.

Each table follows a marker ``<!-- table: NAME -->`` (tools/markdown_tables.py).
``python -m tools.failure_docs [--write]`` says whether the file differs (or rewrites
it); tests/test_failure_class.py holds the file to the tables.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from openclaw_launch.exit_codes import exit_codes_markdown
from openclaw_launch.run.failure_class import classes_markdown
from tools.markdown_tables import check_or_write, update_tables

DOCS_FILE = Path(__file__).resolve().parents[1] / "docs" / "failures.md"
TABLES: dict[str, Callable[[], str]] = {"failure classes": classes_markdown, "exit codes": exit_codes_markdown}


def update(text: str) -> str:
    """``text`` with every marked table rendered afresh."""
    return update_tables(text, lambda name: TABLES[name]())


def main(argv: list[str]) -> int:
    return check_or_write(
        DOCS_FILE, lambda name: TABLES[name](), "the failure classes and exit codes", "--write" in argv
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
