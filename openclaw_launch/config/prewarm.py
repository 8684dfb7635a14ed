"""The names ``--prewarm`` and ``runtime.prewarm`` take (plan/prewarm.py plans the zygote that
imports them): one rule for the command line and the config."""

from __future__ import annotations

import re

_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def prewarm_modules(text: str) -> tuple[str, ...]:
    """``"torch,numpy"`` -> ``("torch", "numpy")``; a name that is no module name raises ValueError."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if not _MODULE_RE.fullmatch(n)]
    if not names or bad:
        raise ValueError(
            f"{text!r}: expected module names separated by commas (e.g. torch or torch,numpy)"
            + (f"; not a module name: {', '.join(bad)}" if bad else "")
        )
    return names
