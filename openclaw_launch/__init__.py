"""openclaw-launch: a topology-aware replacement for torchrun.

The import of this package must stay cheap (no torch, no NVML): the launcher's
start-up time is part of every job's start-up time.
"""

__version__ = "0.1.0"
