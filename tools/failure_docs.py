"""The tables of docs/failures.md, rendered from the failure classes and the exit codes.

Each table follows a marker ``<!-- table: NAME -->`` (tools/markdown_tables.py).
``python -m tools.failure_docs [--write]`` says whether the file differs (or rewrites
it); tests/test_failure_class.py holds the file to the tables.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from openclaw_launch.exit_codes import EXIT_CODES
from openclaw_launch.run.failure_class import CAN_HELP, CANNOT_HELP, CLASSES, MAY_HELP
from tools.markdown_tables import check_or_write, update_tables

DOCS_FILE = Path(__file__).resolve().parents[1] / "docs" / "failures.md"


def classes_table() -> str:
    """The failure classes: whether a restart helps, and what the launcher saw."""
    rows = ["| class | a restart | restarted by `--max-restarts` | what the launcher saw |", "|---|---|---|---|"]
    restarted = {CAN_HELP: "yes", MAY_HELP: "yes", CANNOT_HELP: "only with `--restart-any-class`"}
    rows += [f"| `{c.name}` | {c.restart} | {restarted[c.restart]} | {c.meaning} |" for c in CLASSES]
    return "\n".join(rows) + "\n"


def exit_codes_table() -> str:
    """The launcher's own exit codes and their meaning."""
    rows = ["| exit code | meaning |", "|---|---|"]
    rows += [f"| {c.code} | {c.meaning} |" for c in EXIT_CODES]
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[], str]] = {"failure classes": classes_table, "exit codes": exit_codes_table}


def update(text: str) -> str:
    """``text`` with every marked table rendered afresh."""
    return update_tables(text, lambda name: TABLES[name]())


def main(argv: list[str]) -> int:
    return check_or_write(
        DOCS_FILE, lambda name: TABLES[name](), "the failure classes and exit codes", "--write" in argv
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
