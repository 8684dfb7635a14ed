"""openclaw-launch: a topology-aware replacement for torchrun.

The import of this package must stay cheap (no torch, no NVML): the launcher's
start-up time is part of every job's start-up time.
"""

from __future__ import annotations

#: ``typing.TYPE_CHECKING`` without importing typing (~7 ms before the entry point's signal handlers:
#: __main__.py); mypy takes any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from openclaw_launch.plan.parallel import ParallelGroups

__version__ = "0.1.0"


def parallel_groups() -> ParallelGroups:
    """This rank's TP/PP/DP groups and device-mesh arguments (no torch; see ``parallel.py``)."""
    from openclaw_launch.plan.parallel import parallel_groups as read

    return read()
