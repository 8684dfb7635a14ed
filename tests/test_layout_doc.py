"""docs/design.md's Layout block names exactly the package's modules, each under its package, so the
layout it describes is the one on disk (a module added, moved or removed fails here until the doc
says so)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "openclaw_launch"
_MODULE = re.compile(r"^[a-z_]+\.py$")


def documented_modules(design: str) -> set[str]:
    """Module paths (``run/mps/daemon.py``) from the Layout block: a line's first column (before a
    run of two spaces) is a package (``name/``, nested by indent) or a comma-separated module list;
    lines with an empty first column continue a description."""
    block = design.split("## Layout", 1)[1].split("```", 2)[1]
    packages: list[tuple[int, str]] = []  # (indent, name) from the outermost
    found: set[str] = set()
    for line in block.splitlines():
        if not line.strip() or line.startswith("openclaw_launch/") or line.startswith("tests/"):
            continue
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0]
        if names.endswith("/"):
            packages = [p for p in packages if p[0] < indent] + [(indent, names)]
            continue
        parts = [n.strip() for n in names.split(",")]
        if not all(_MODULE.match(p) for p in parts):
            continue  # a description's continuation
        prefix = "".join(name for level, name in packages if level < indent)
        found |= {prefix + p for p in parts}
    return found


def modules_on_disk() -> set[str]:
    """Every module; an ``__init__.py`` only when it defines something (an API, not a docstring)."""
    out = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        defines = any(isinstance(n, ast.FunctionDef | ast.ClassDef) for n in tree.body)
        if path.name != "__init__.py" or defines:
            out.add(path.relative_to(PACKAGE).as_posix())
    return out


def test_design_layout_names_every_module_and_no_other() -> None:
    documented = documented_modules((ROOT / "docs" / "design.md").read_text())
    on_disk = modules_on_disk()
    missing, gone = sorted(on_disk - documented), sorted(documented - on_disk)
    assert not missing, f"modules missing from docs/design.md's Layout: {missing}"
    assert not gone, f"docs/design.md's Layout names modules that do not exist: {gone}"


def test_the_parser_reads_packages_nesting_and_continuations() -> None:
    doc = (
        "## Layout\n```\nopenclaw_launch/\n  errors.py  the tree\n  run/  effects\n    a.py, b.py  one; two\n"
        "                two, continued\n    mps/  daemon\n      c.py  three\n    d.py  four\n  e.py  top\n```\n"
    )
    assert documented_modules(doc) == {"errors.py", "run/a.py", "run/b.py", "run/mps/c.py", "run/d.py", "e.py"}
