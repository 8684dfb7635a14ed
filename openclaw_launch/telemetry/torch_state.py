"""What a worker's progress thread reads of torch, never importing it (the script did): the backend
of the script's default process group, and from torch's flight recorder the newest collective the
rank entered per process group (the number torch's analyser matches ranks by, stats/hang.py).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence

import openclaw_launch.telemetry.wire as wire

FLIGHT_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def default_group_backend() -> str | None:
    """The backend of the script's default process group; never imports torch."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_initialized():
            return str(dist.get_backend())
    except Exception:  # torch-internal state mid-change: ask again next time
        return None
    return None


def last_collectives(entries: Sequence[dict[str, object]]) -> tuple[wire.LastCollective, ...]:
    """Per process group, the newest collective (highest ``collective_seq_id``, p2p left out) in a
    flight-recorder dump's entries: the number torch's analyser matches ranks by."""
    newest: dict[str, dict[str, object]] = {}
    for e in entries:
        group = e.get("process_group")
        seq = e.get("collective_seq_id")
        if e.get("is_p2p") or not isinstance(seq, int) or not isinstance(group, tuple | list) or not group:
            continue
        name = str(group[0])
        old = newest.get(name)
        if old is None or seq > int(old["collective_seq_id"]):  # type: ignore[call-overload]
            newest[name] = e
    return tuple(
        wire.LastCollective(
            group=name,
            seq=int(e["collective_seq_id"]),  # type: ignore[call-overload]
            op=str(e.get("profiling_name") or "?").split(":")[-1],
            done=e.get("state") == "completed" or bool(e.get("retired")),
        )
        for name, e in sorted(newest.items())
    )


def read_last_collectives() -> tuple[wire.LastCollective, ...]:
    """From torch's flight recorder, when the rank has one (a buffer size set, torch imported)."""
    if not any((os.environ.get(v) or "0").strip() not in ("", "0") for v in FLIGHT_RECORDER_VARS):
        return ()
    torch = sys.modules.get("torch")
    try:
        c10d = torch._C._distributed_c10d  # type: ignore[union-attr]
        for name in ("_dump_nccl_trace", "_dump_fr_trace"):
            dump = getattr(c10d, name, None)
            if dump is not None:
                data = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))
                found = last_collectives(data.get("entries", ()))
                if found:
                    return found
    except Exception:  # torch-internal: never hurt the job
        return ()
    return ()
