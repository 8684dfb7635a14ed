"""The report's record of an attempt's failure: its class (run/failure_class.py) and evidence."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc
from openclaw_launch.run.failure_class import CLASSES


def _class_names() -> str:
    """Every failure class, in the table's order: docs/report-format.md's list is made from the code."""
    names = [f"`{c.name}`" for c in CLASSES]
    return f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class AttemptFailure:
    failure_class: str = field(metadata=doc(f"{_class_names()} ([`docs/failures.md`](failures.md#classes))"))
    restart_helps: bool = field(
        metadata=doc("the class's: the cause is outside the script (`--exit-code-classes`: 75, else 70)")
    )
    detail: str = field(
        metadata=doc("the evidence that decided it, e.g. `ValueError`, `NVML: XID 79 on GPU-...`, `SIGKILL`")
    )
    rank: int | None = field(metadata=doc("the failed rank; null for a lost node"))
    node: str | None = field(metadata=doc("its node (a lost or remote stop: the other node)"))
    storm: bool = field(
        metadata=doc(
            "true: the same class on the same rank before its first step as in the attempt before: the job "
            "stopped here instead of restarting (restart storm)"
        )
    )
