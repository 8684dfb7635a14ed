"""The report's record of an attempt's failure: its class (run/failure_class.py) and evidence."""

from __future__ import annotations

from dataclasses import dataclass, field

from openclaw_launch.codec import doc


@dataclass(frozen=True)
class AttemptFailure:
    failure_class: str = field(
        metadata=doc(
            "`gpu-xid`, `gpu-ecc`, `node-lost`, `hang`, `nccl`, `killed`, `host-oom`, `cuda-oom`, `exception`, "
            "`crash`, `not-started`, `exit` or `remote` ([`docs/failures.md`](failures.md))"
        )
    )
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
