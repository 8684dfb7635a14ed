"""The launcher's own TORCHELASTIC_ERROR_FILE, written as torchrun writes it.

A scheduler that starts torchrun with TORCHELASTIC_ERROR_FILE set reads the job's root cause from
it. torchrun copies the failed worker's ``@record`` file there (its exit code in ``errorCode``), or,
when the worker wrote none, records its own exception: ``{"message": {"message": "<Type>: <text>",
"extraInfo": {"py_callstack": ..., "timestamp": ...}}}``. This module does the same.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from openclaw_launch.files import write_atomic
from openclaw_launch.limits import MAX_ERROR_FILE_BYTES
from openclaw_launch.run.results import JobResult, format_root_cause, signal_name
from openclaw_launch.safe_read import parse_json, read_untrusted


def parent_error_data(result: JobResult, worker_file_text: str | None) -> dict[str, object]:
    """What torchrun would write for ``result``; ``worker_file_text``: the root cause's own file."""
    root = result.root_cause
    if root is not None and worker_file_text:
        try:
            data = parse_json(worker_file_text)
        except ValueError:
            data = None
        if isinstance(data, dict) and "message" in data:
            if isinstance(data["message"], dict) and root.code:
                data["message"]["errorCode"] = root.code
            return data
    if root is not None:
        text = f"ChildFailedError: rank {root.rank} (local rank {root.local_rank}) on node {root.node} failed"
        callstack = format_root_cause(root)
    elif result.signal_received is not None:
        text = f"SignalException: Process {os.getpid()} got signal: {result.signal_received}"
        callstack = f"{text} ({signal_name(result.signal_received)}); the launcher stopped the workers"
    else:
        text = callstack = f"openclaw-launch failed with exit code {result.exit_code}"
    return {"message": {"message": text, "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))}}}


def write_parent_error_file(path: str, result: JobResult, warn: Callable[[str], None]) -> None:
    """Write the root cause of a failed job to ``path``; a failure to write is a warning, not a crash."""
    root = result.root_cause
    worker_text = read_untrusted(root.error_file, MAX_ERROR_FILE_BYTES, warn) if root and root.error_file else None
    try:
        write_atomic(path, json.dumps(parent_error_data(result, worker_text)))
    except OSError as e:
        warn(f"openclaw-launch: warning: cannot write TORCHELASTIC_ERROR_FILE {path}: {e}")
