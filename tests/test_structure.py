"""The package's structure, checked on its source: imports run one way down the stages, no import
cycle, no re-export facade.

Every ``import`` / ``from ... import`` counts, wherever it is (module level, inside a function,
under ``if TYPE_CHECKING:``): a lower stage never imports a higher one, not even lazily. A module's
size is a prompt to split it by concern in review (the before-stop hook names the long ones), never
a test: a line limit that fails at 401 invites joined lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = "openclaw_launch"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
#: The stages, top first (docs/design.md, "Layout"): an import goes only from a stage to one below it.
#: A module of the package root (codec, errors, exit_codes, files, limits, safe_read, startup) is the ground.
STAGES = (
    ("cli",),
    ("job",),
    ("preflight", "validate"),
    ("agents",),
    ("report",),
    ("stats",),
    ("run",),
    ("plan",),
    ("config",),
    ("topology",),
    ("telemetry",),
)


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        out[name] = path
    return out


def _imported(name: str, path: Path, modules: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """(module of the package, line) for each import in ``path``; ``from pkg import sub`` names the
    submodule ``pkg.sub`` when there is one."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    yield sub, node.lineno
                elif base in modules:
                    yield base, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}."""
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in _imported(name, path, modules):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One cycle (as a path that ends where it starts) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, {}):
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(component, graph) for component in components]


def _cycle_in(component: list[str], graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return [*paths[v], start]
                if w in members and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component always has one


def _describe(cycle: list[str], graph: Mapping[str, Mapping[str, int]]) -> str:
    hops = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return " -> ".join([*hops, cycle[-1]])


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, graph) for c in cycles)


def stage_of(module: str) -> int:
    """0 for the ground, else the stage's height (the lowest stage is 1)."""
    parts = module.split(".")
    if len(parts) < 3 and not (len(parts) == 2 and any(parts[1] in level for level in STAGES)):
        return 0  # openclaw_launch.errors, openclaw_launch itself
    name = parts[1]
    for height, level in enumerate(reversed(STAGES), start=1):
        if name in level:
            return height
    raise AssertionError(f"{module}: {name}/ is no stage of STAGES: add it where it belongs")


def upward_imports(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """Every import from a stage to one above it (or to another of its own level), as text."""
    found = []
    for module, edges in sorted(graph.items()):
        if module in (PACKAGE, f"{PACKAGE}.__main__"):
            continue  # the entry points start the CLI
        mine = stage_of(module)
        for target, line in sorted(edges.items()):
            theirs = stage_of(target)
            same_stage = target.split(".")[1:2] == module.split(".")[1:2]
            if theirs > mine or (theirs == mine and mine and not same_stage):
                found.append(f"{module} (line {line}) imports {target}")
    return found


def test_imports_run_down_the_stages() -> None:
    found = upward_imports(import_graph())
    assert not found, "imports that run back up the stages (move the module to the stage it serves):\n" + "\n".join(
        found
    )


def test_the_stage_check_sees_an_import_up_and_across() -> None:
    graph = {
        "openclaw_launch.run.a": {"openclaw_launch.stats.b": 4, "openclaw_launch.errors": 1},
        "openclaw_launch.preflight.c": {"openclaw_launch.validate.d": 7},
        "openclaw_launch.errors": {"openclaw_launch.run.a": 2},
        "openclaw_launch.job.e": {"openclaw_launch.run.a": 3, "openclaw_launch.limits": 5},
    }
    assert upward_imports(graph) == [
        "openclaw_launch.errors (line 2) imports openclaw_launch.run.a",
        "openclaw_launch.preflight.c (line 7) imports openclaw_launch.validate.d",
        "openclaw_launch.run.a (line 4) imports openclaw_launch.stats.b",
    ]


def _reexports(path: Path) -> list[str]:
    """What ``path`` hands on from elsewhere: ``from X import Y as Y``, or ``__all__`` naming an
    imported name."""
    tree = ast.parse(path.read_text(), str(path))
    found, imported = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if alias.asname == alias.name:
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name} as {alias.name}")
        elif isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = ast.literal_eval(node.value)
            found += [f"line {node.lineno}: __all__ re-exports {n}" for n in names if n in imported]
    return found


def test_no_module_re_exports_another_ones_names() -> None:
    facades = {name: found for name, path in _modules().items() if (found := _reexports(path))}
    assert not facades, "import these names from the module that defines them:\n" + "\n".join(
        f"{name}: {'; '.join(found)}" for name, found in sorted(facades.items())
    )


def test_the_checks_see_a_cycle_a_facade_and_lazy_imports(tmp_path: Path) -> None:
    """The checker itself: a function-level and a TYPE_CHECKING import close a cycle; an alias
    re-export and an ``__all__`` of imported names are facades."""
    graph = {"a": {"b": 3}, "b": {"c": 9}, "c": {"a": 1}, "d": {"a": 2}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b": 1}, "b": {}}) == []
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import n\n"
        "def f():\n    import p.n\nfrom p.n import x as x\n__all__ = ['x', 'f']\n"
    )
    (pkg / "n.py").write_text("x = 1\n")
    modules = {"p.m": pkg / "m.py", "p.n": pkg / "n.py"}
    assert [t for t, _ in _imported("p.m", pkg / "m.py", modules)] == ["p.n", "p.n", "p.n"]
    assert len(_reexports(pkg / "m.py")) == 2
