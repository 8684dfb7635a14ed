"""The generated tables of docs/torchrun-compat.md and docs/multinode.md, rendered from the tables the
launcher itself uses: torchrun's flags (``cli/torchrun_compat.FLAGS``, which also build the options
and ``--help``), the defaults (``config/defaults.DEFAULTS``) and the fingerprint keys whose difference
only warns (``agents/fingerprint.WARN_ONLY``).

Each table follows a marker ``<!-- table: NAME -->`` (tools/markdown_tables.py: the rule of every
generated table). ``python -m tools.option_docs [--write]`` says whether a file differs from its
sources (or rewrites it); tests/test_torchrun_compat.py and tests/test_agents.py hold the files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from openclaw_launch.agents.fingerprint import WARN_ONLY
from openclaw_launch.cli.torchrun_compat import FLAGS, OTHER_VARIABLES
from openclaw_launch.config.defaults import DEFAULTS
from tools.markdown_tables import check_or_write, update_tables

DOCS = Path(__file__).resolve().parents[1] / "docs"
COMPAT_FILE = DOCS / "torchrun-compat.md"
MULTINODE_FILE = DOCS / "multinode.md"


def flags_table() -> str:
    """torchrun's flags, their variables and what each does here."""
    rows = ["| torchrun flag | variable | here |", "|---|---|---|"]
    for f in FLAGS:
        names = ", ".join(f"`{n}`" for n in f.torchrun)
        if f.ours:
            names += f" (ours: {', '.join(f'`{n}`' for n in f.ours)})"
        env = ", ".join(f"`{e}`" for e in f.env) or "-"
        rows.append(f"| {names} | {env} | {f.here} |")
    return "\n".join(rows) + "\n"


def variables_table() -> str:
    """The variables torchrun reads besides ``PET_*``, and what they do here."""
    rows = ["| variable | here |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" for name, what in OTHER_VARIABLES]
    return "\n".join(rows) + "\n"


def defaults_table() -> str:
    """Every option's default, beside torchrun's."""
    rows = ["| option | default | torchrun's | what |", "|---|---|---|---|"]
    for d in DEFAULTS:
        names = ", ".join(f"`{name}`" for name in d.option.split(", "))
        rows.append(f"| {names} | `{d.value}` | {d.torchrun} | {d.meaning} |")
    return "\n".join(rows) + "\n"


def warn_only_table() -> str:
    """The fingerprint keys whose difference between nodes only warns."""
    rows = ["| fingerprint key | why a difference only warns |", "|---|---|"]
    rows += [f"| `{rule.pattern}` | {rule.why} |" for rule in WARN_ONLY]
    return "\n".join(rows) + "\n"


# docs file -> its tables by marker name
FILES: dict[Path, dict[str, Callable[[], str]]] = {
    COMPAT_FILE: {"torchrun flags": flags_table, "torchrun variables": variables_table, "defaults": defaults_table},
    MULTINODE_FILE: {"warn-only fingerprint keys": warn_only_table},
}


def update(path: Path, text: str) -> str:
    """``text`` of the docs file ``path`` with every marked table rendered afresh."""
    return update_tables(text, lambda name: FILES[path][name]())


def main(argv: list[str]) -> int:
    write = "--write" in argv
    codes = [
        check_or_write(path, lambda name, t=tables: t[name](), "the launcher's option tables", write)
        for path, tables in FILES.items()
    ]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
