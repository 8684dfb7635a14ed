"""Slurm hostlists (``n[1-2,5]``, ``gpu-a[01-03],gpu-b7``) as host names.

``expand_hostlist`` (the multi-node MASTER_ADDR default, cli/common.py) runs ``scontrol show
hostnames`` when it is on PATH (Slurm's own expansion, always right); finding this node's position
(agents/identity.py) and a host without scontrol use ``parse_hostlist``, which covers Slurm's
documented forms: comma-separated names, each with any number of bracketed ranges/lists, zero
padding kept (``[08-10]`` is 08, 09, 10). No library fits: python-hostlist is GPL-2.0, ClusterShell is
CeCILL-C (copyleft) and a large dependency, py-hostlist is an unmaintained 0.0.2.dev0.
``compress_hostlist`` goes the other way, for ``preflight --exclude-file`` (``sbatch --exclude``),
pure: the same text as ``scontrol show hostlistsorted`` (a test compares them), duplicates dropped.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Sequence

from openclaw_launch.errors import PlanError
from openclaw_launch.single_thread import assert_single_threaded


def expand_hostlist(text: str, use_scontrol: bool = True) -> list[str]:
    """The hosts of a Slurm hostlist, in order (``scontrol show hostnames`` when present)."""
    text = text.strip()
    if not text:
        return []
    scontrol = shutil.which("scontrol") if use_scontrol else None
    if scontrol:
        assert_single_threaded("run scontrol show hostnames")
        try:
            out = subprocess.run(
                [scontrol, "show", "hostnames", text], capture_output=True, text=True, timeout=10, check=True
            )
            hosts = out.stdout.split()
            if hosts:
                return hosts
        except (OSError, subprocess.SubprocessError):
            pass  # a broken scontrol: the parser below still knows the syntax
    return parse_hostlist(text)


def parse_hostlist(text: str) -> list[str]:
    """Pure expansion; ``PlanError`` naming the text on a malformed list."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        hosts += _expand_item(item, text)
    return hosts


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [i for i in (s.strip() for s in items) if i]


def _expand_item(item: str, whole: str) -> list[str]:
    parts: list[list[str]] = []
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            if "]" in rest:
                raise PlanError(f"malformed Slurm hostlist {whole!r}: unmatched ']'")
            parts.append([rest])
            break
        close_at = rest.find("]", open_at)
        if close_at < 0 or "[" in rest[open_at + 1 : close_at]:
            raise PlanError(f"malformed Slurm hostlist {whole!r}: unmatched '['")
        if open_at:
            parts.append([rest[:open_at]])
        parts.append(_ranges(rest[open_at + 1 : close_at], whole))
        rest = rest[close_at + 1 :]
    return ["".join(p) for p in itertools.product(*parts)]


def _ranges(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for piece in body.split(","):
        lo, sep, hi = piece.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise PlanError(f"malformed Slurm hostlist {whole!r}: {piece!r} is not N or N-M")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise PlanError(f"malformed Slurm hostlist {whole!r}: range {piece!r} goes down")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out += [str(n).zfill(width) for n in range(a, b + 1)]
    return out


def compress_hostlist(hosts: Sequence[str]) -> str:
    """The Slurm hostlist of ``hosts`` (``node[01-03,07],login``), as ``sbatch --exclude`` takes it:
    names that differ only in a trailing number share one bracket, zero padding kept; duplicates
    dropped; sorted by prefix, then number. ``parse_hostlist`` of it gives the same set of names."""
    plain: set[str] = set()
    numbered: dict[tuple[str, int], set[int]] = {}  # (prefix, padded width or 0) -> numbers
    padded: dict[str, set[int]] = {}
    split = []
    for host in dict.fromkeys(hosts):
        m = re.fullmatch(r"(.*?)(\d+)", host)
        if m is None:
            plain.add(host)
            continue
        prefix, digits = m.groups()
        split.append((prefix, digits))
        if digits.startswith("0") and len(digits) > 1:
            padded.setdefault(prefix, set()).add(len(digits))
    for prefix, digits in split:
        width = len(digits) if len(digits) in padded.get(prefix, set()) else 0
        numbered.setdefault((prefix, width), set()).add(int(digits))
    items = [(host, "") for host in plain]
    for (prefix, width), numbers in numbered.items():
        ranges = _ranges_of(sorted(numbers), width)
        body = ranges[0] if len(ranges) == 1 and "-" not in ranges[0] else f"[{','.join(ranges)}]"
        items.append((prefix, body))
    return ",".join(prefix + body for prefix, body in sorted(items, key=lambda i: (i[0], _first(i[1]))))


def _ranges_of(numbers: list[int], width: int) -> list[str]:
    """Consecutive runs of sorted numbers as ``N`` or ``N-M``, each ``zfill(width)``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    fmt = [(str(a).zfill(width), str(b).zfill(width)) for a, b in runs]
    return [a if a == b else f"{a}-{b}" for a, b in fmt]


def _first(body: str) -> int:
    """The first number of a bracket body (sort key); 0 for a plain name."""
    m = re.search(r"\d+", body)
    return int(m.group()) if m else -1
