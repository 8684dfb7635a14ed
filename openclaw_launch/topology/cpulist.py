"""The kernel's CPU list format (``0-23,48-71``), used by sysfs, numactl and nvidia-smi."""

from __future__ import annotations

import re
from collections.abc import Iterable

from openclaw_launch.limits import MAX_CPU_ID

_ITEM_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8\\n"`` -> ``(0, 1, 2, 3, 8)``, sorted, without duplicates. ``""`` -> ``()``.

    Raises ValueError for anything else, so a corrupt file is not read as "no CPUs", and for ids over
    ``limits.MAX_CPU_ID`` (``0-4000000000`` is a typo, not gigabytes of set to build).
    """
    cpus: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return ()
    for item in stripped.split(","):
        m = _ITEM_RE.match(item.strip())
        if not m:
            raise ValueError(f"not a CPU list: {text!r} (expected e.g. 0-23,48-71)")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise ValueError(f"not a CPU list: {text!r} (range {item.strip()!r} runs backwards)")
        if hi > MAX_CPU_ID:
            raise ValueError(f"not a CPU list: {text!r} ({hi} is over {MAX_CPU_ID}, the most a machine has)")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def cpu_ranges(cpus: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted CPUs grouped into inclusive ``(first, last)`` runs."""
    runs: list[tuple[int, int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs


def format_cpulist(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``: the inverse of ``parse_cpulist``."""
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in cpu_ranges(cpus))
