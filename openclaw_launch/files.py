"""Writing files that others read while we run (reports, snapshots, configs)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Temp file in the same directory + rename: a reader sees the old file or the whole new one,
    never half of it, and a failed write leaves no temp file behind. Missing parent directories are
    made (``--report logs/$SLURM_JOB_ID/report.json`` must not fail at the end of a long job)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
