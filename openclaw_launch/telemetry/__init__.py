"""Worker API for per-step statistics: ``telemetry.step()`` and ``with telemetry.section(name):``.

Two lines make the launcher's straggler verdict exact::

    from openclaw_launch import telemetry
    for batch in loader:                      # or: with telemetry.section("data"): batch = next(it)
        with telemetry.section("compute"):
            ...
        telemetry.step()

Outside openclaw-launch (plain python, torchrun) every call is a no-op, so scripts stay portable.
Importing this module costs well under a millisecond: it loads nothing until the first call.
Section names ``data``/``input`` are the input stage; ``sync`` marks waiting for other ranks;
any other name is work of this rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["section", "step"]


def step() -> None:
    """Mark the end of one training step (call it once per iteration)."""
    from openclaw_launch.telemetry.recorder import get

    rec = get()
    if rec is not None:
        rec.step("api")


@contextmanager
def section(name: str) -> Iterator[None]:
    """Time the enclosed block as phase ``name`` of the current step."""
    from openclaw_launch.telemetry.recorder import get
    from openclaw_launch.telemetry.wire import SECTION_ALIASES

    rec = get()
    entered = rec is not None and rec.enter(SECTION_ALIASES.get(name, name))
    try:
        yield
    finally:
        if entered and rec is not None:
            rec.leave()
