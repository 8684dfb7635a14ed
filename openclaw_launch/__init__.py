"""openclaw-launch: a topology-aware replacement for torchrun.

The import of this package must stay cheap (no torch, no NVML): the launcher's
start-up time is part of every job's start-up time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openclaw_launch.plan.parallel import ParallelGroups

__version__ = "0.1.0"


def parallel_groups() -> ParallelGroups:
    """This rank's TP/PP/DP groups and device-mesh arguments (no torch; see ``parallel.py``)."""
    from openclaw_launch.plan.parallel import parallel_groups as read

    return read()
