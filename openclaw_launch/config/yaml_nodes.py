"""Reading a composed PyYAML node tree so that every problem carries its key path and line.

``BoundedLoader`` composes (safe YAML, bounded depth); ``NodeReader`` reads mappings (unknown,
duplicate and missing keys), lists and scalars (booleans, integers in range, seconds, text exactly
as written, choices), collecting problems and warnings instead of stopping at the first. What a
config's sections mean is ``config/document.py``'s and ``config/runtime_reader.py``'s.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from openclaw_launch.errors import Problem
from openclaw_launch.limits import MAX_SECONDS, MAX_YAML_DEPTH, seconds_problem

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a plain key (and an environment variable name)
TAG = "tag:yaml.org,2002:"
KINDS = {
    "null": "null (an empty value)",
    "bool": "a boolean",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "map": "a mapping",
    "seq": "a list",
    "timestamp": "a date",
    "binary": "binary data",
}
Y_CONSTRUCT = yaml.constructor.SafeConstructor()


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than ``MAX_YAML_DEPTH`` (PyYAML composes recursively:
    a few hundred levels are a RecursionError)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def syntax_problem(e: yaml.YAMLError, text: str) -> Problem:
    """A YAML parse error as one Problem, with the line where the parser stopped."""
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        what = e.problem or "invalid YAML"
        if e.context:
            what = f"{what} ({e.context})"
        col = f", column {mark.column + 1}" if mark is not None else ""
        return Problem("yaml", line, f"YAML syntax error{col}: {what}")
    if isinstance(e, yaml.reader.ReaderError):
        line = text.count("\n", 0, e.position) + 1
        return Problem("yaml", line, f"YAML syntax error: character {e.character!r} is not allowed")
    return Problem("yaml", None, f"YAML syntax error: {e}")


def line_of(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def short_tag(node: yaml.Node) -> str:
    return node.tag[len(TAG) :] if node.tag.startswith(TAG) else node.tag


def kind_of(node: yaml.Node) -> str:
    """What the user wrote, for "expected X, got Y" messages."""
    kind = KINDS.get(short_tag(node), f"tag {node.tag}")
    if isinstance(node, yaml.ScalarNode) and short_tag(node) not in ("null", "str"):
        return f"{kind} ({node.value})"
    if isinstance(node, yaml.ScalarNode) and short_tag(node) == "str":
        return f"{kind} ({node.value!r})"
    return kind


def is_null(node: yaml.Node | None) -> bool:
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == TAG + "null")


def join_path(path: str, key: str) -> str:
    """Key path syntax: ``a.b``, ``a['odd key']``."""
    if not NAME_RE.match(key):
        return f"{path}[{key!r}]"
    return f"{path}.{key}" if path else key


@dataclass(frozen=True)
class Entry:
    """One ``key: value`` pair of a mapping; errors about the value point at the key's line."""

    key: yaml.Node
    value: yaml.Node
    path: str

    @property
    def line(self) -> int:
        return line_of(self.key)


def first_use(seen: dict[Any, str], key: Any, e: Entry) -> str | None:
    """Where ``key`` was first seen ("path (line N)"), or None after recording this as the first."""
    if key in seen:
        return seen[key]
    seen[key] = f"{e.path} (line {e.line})"
    return None


class NodeReader:
    """Reads nodes of a composed tree, collecting every problem and warning (with key path and line)."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def error(self, path: str, line: int | None, message: str) -> None:
        self.problems.append(Problem(path, line, message))

    def warn(self, path: str, line: int | None, message: str) -> None:
        self.warnings.append(Problem(path, line, message))

    def misplaced_hint(self, key: str) -> str:
        """Where an unknown key (no close match) belongs instead, as a sentence; none by default."""
        return ""

    # -- structure -------------------------------------------------------------------------

    def safe(self, node: yaml.Node, path: str, line: int) -> bool:
        """Only plain YAML: an explicit foreign tag (``!!python/...``, ``!foo``) is an error."""
        tag = short_tag(node)
        if node.tag.startswith(TAG) and tag in KINDS:
            return True
        self.error(path, line, f"YAML tag {node.tag!r} is not allowed (safe YAML only); remove it")
        return False

    def mapping(
        self,
        node: yaml.Node,
        path: str,
        line: int,
        valid: Sequence[str],
        required: Sequence[str] = (),
    ) -> dict[str, Entry] | None:
        """The known keys of a mapping. Unknown, duplicate and missing keys are reported."""
        if not self.safe(node, path, line):
            return None
        if not isinstance(node, yaml.MappingNode):
            self.error(
                path or "(top level)", line, f"expected a mapping with keys {listing(valid)}, got {kind_of(node)}"
            )
            return None
        out: dict[str, Entry] = {}
        first_line: dict[str, int] = {}
        suggested: set[str] = set()
        for key_node, value in node.value:
            key_line = line_of(key_node)
            if key_node.tag == TAG + "merge":
                first_line["<<"] = key_line
                self.error(
                    join_path(path, "<<"),
                    key_line,
                    "YAML merge keys ('<<') are not supported; "
                    "write the keys out (anchors and aliases of whole values are fine)",
                )
                continue
            if not isinstance(key_node, yaml.ScalarNode) or not self.safe(key_node, path, key_line):
                self.error(path or "(top level)", key_line, "keys must be plain names")
                continue
            key = str(key_node.value)
            kpath = join_path(path, key)
            if key in first_line:
                self.error(
                    kpath,
                    key_line,
                    f"duplicate key {key!r} (first at line {first_line[key]}); "
                    "YAML would silently keep only the last one",
                )
                continue
            first_line[key] = key_line
            if key not in valid:
                close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
                suggested.update(close)
                mean = f"; did you mean {close[0]!r}?" if close else "."
                extra = "" if close else self.misplaced_hint(key)
                self.error(kpath, key_line, f"unknown key {key!r}{mean}{extra} Valid keys: {listing(valid)}")
                continue
            out[key] = Entry(key_node, value, kpath)
        for key in required:
            if key not in out and key not in suggested and "<<" not in first_line and key not in first_line:
                self.error(join_path(path, key), line_of(node), f"required key {key!r} is missing")
        return out

    def sequence(self, entry: Entry, what: str) -> list[yaml.Node] | None:
        if not self.safe(entry.value, entry.path, entry.line):
            return None
        if not isinstance(entry.value, yaml.SequenceNode):
            self.error(entry.path, entry.line, f"expected {what}, got {kind_of(entry.value)}")
            return None
        return list(entry.value.value)

    # -- scalars ---------------------------------------------------------------------------

    def scalar(
        self, node: yaml.Node, path: str, line: int, expected: str, tags: Sequence[str]
    ) -> yaml.ScalarNode | None:
        """``node`` when it is a safe scalar with one of ``tags``; otherwise report it."""
        if not self.safe(node, path, line):
            return None
        if isinstance(node, yaml.ScalarNode) and short_tag(node) in tags:
            return node
        quoted = ""
        if isinstance(node, yaml.ScalarNode) and node.style in ("'", '"') and "str" not in tags:
            quoted = " (remove the quotes)"
        self.error(path, line, f"expected {expected}, got {kind_of(node)}{quoted}")
        return None

    def boolean(self, e: Entry) -> bool | None:
        node = self.scalar(e.value, e.path, e.line, "a boolean (true or false)", ("bool",))
        return None if node is None else bool(Y_CONSTRUCT.construct_yaml_bool(node))

    def integer(self, e: Entry, lo: int, hi: int | None = None) -> int | None:
        what = f"an integer >= {lo}" if hi is None else f"an integer from {lo} to {hi}"
        node = self.scalar(e.value, e.path, e.line, what, ("int",))
        if node is None:
            return None
        try:
            value = int(Y_CONSTRUCT.construct_yaml_int(node))
        except ValueError:
            self.error(e.path, e.line, f"expected {what}, got {node.value!r}")
            return None
        if value < lo or (hi is not None and value > hi):
            self.error(e.path, e.line, f"{value} is out of range: expected {what}")
            return None
        return value

    def seconds(self, e: Entry, lo: float) -> float | None:
        """A duration in seconds, ``lo`` .. limits.MAX_SECONDS."""
        what = f"a number of seconds from {lo:g} to {MAX_SECONDS:g}"
        node = self.scalar(e.value, e.path, e.line, what, ("int", "float"))
        if node is None:
            return None
        try:
            value = float(str(node.value).replace("_", ""))
        except ValueError:
            self.error(e.path, e.line, f"expected {what}, got {node.value!r}")
            return None
        problem = seconds_problem(value, lo)
        if problem is not None:
            self.error(e.path, e.line, problem)
            return None
        return value

    def text(self, e: Entry, what: str = "a string") -> str | None:
        """A plain scalar's text exactly as written: YAML 1.1 turns ``0000:00:06.0`` into a
        number and ``010`` into 8, but an identifier must stay what the operator typed."""
        node = self.scalar(e.value, e.path, e.line, what, ("str", "int", "float"))
        return None if node is None else str(node.value)

    def choice(self, e: Entry, choices: Sequence[str]) -> str | None:
        what = f"one of {listing(choices)}"
        node = self.scalar(e.value, e.path, e.line, what, ("str",))
        if node is None:
            return None
        value = str(node.value)
        if value not in choices:
            close = difflib.get_close_matches(value, choices, n=1)
            mean = f" (did you mean {close[0]!r}?)" if close else ""
            self.error(e.path, e.line, f"{value!r} is not valid{mean}: expected {what}")
            return None
        return value


def given(m: dict[str, Entry], key: str) -> bool:
    """Present with a non-null value (``key:`` alone means "not set")."""
    return key in m and not is_null(m[key].value)


def listing(choices: Sequence[str]) -> str:
    return ", ".join(repr(c) for c in choices)


def mistyped(node: yaml.Node, wanted: Sequence[str], valid: Sequence[str]) -> bool:
    """A key of ``node`` already reported (a typo of one of ``wanted``, or a merge key) may have
    been meant to supply ``wanted``: saying they are missing too would only add noise."""
    keys = [str(k.value) for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
    if "<<" in keys:
        return True
    for key in keys:
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6) if key not in valid else []
        if close and close[0] in wanted:
            return True
    return False
