"""stats/ hands the report typed values and has no serialiser of its own: the one codec
(openclaw_launch/codec.py) writes what the session found, in the report and on the helper's link."""

from __future__ import annotations

import ast
from pathlib import Path

STATS = Path(__file__).resolve().parent.parent / "openclaw_launch" / "stats"


def test_no_module_of_stats_writes_its_types_as_json_by_hand() -> None:
    """A ``to_json`` (or a dataclass's ``asdict``) beside the codec is a second description of the
    report's shape to keep in step with the types."""
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted(STATS.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.FunctionDef) and node.name == "to_json")
        or (isinstance(node, ast.Name | ast.Attribute) and getattr(node, "id", getattr(node, "attr", "")) == "asdict")
    ]
    assert not found, found
