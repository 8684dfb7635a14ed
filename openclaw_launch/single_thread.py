"""One thread at fork, asserted where it happens.

The launcher forks (the guardian, the cgroup probe, helper processes) and spawns (workers with a
``preexec_fn``, the MPS daemon, py-spy, small commands); in a process with threads a fork copies
locks another thread holds, and the child can wait on them forever (CPython documents fork with
threads as unsafe). So the launcher never has a second thread (docs/design.md, "One thread at
fork"; threaded work runs in run/helper.py's helpers), and every fork and spawn site calls
``assert_single_threaded`` first: a thread that crept in is an internal error that names it, not a
rare hang.

The entry point (``__main__.py``) arms the check for the launcher's process. A program that calls
the launcher's parts as a library (``supervise``, the tests: a pytest-xdist worker has an I/O thread
of its own) answers for its own threads. The check is cheap, on the start path: Python's count of
its threads, then the kernel's count of this process's tasks (one read of /proc/self/task, ~20 µs),
which also sees the threads a C library started (NVML, a CUDA runtime, an OpenMP pool) and that
Python does not know of.
"""

from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"
_armed = False


class ThreadedForkError(RuntimeError):
    """The launcher was about to fork or spawn with more than one thread: a bug of the launcher."""


def arm() -> None:
    """This process is the launcher: from now on every fork and spawn is checked."""
    global _armed
    _armed = True


def assert_single_threaded(what: str) -> None:
    """Raise ``ThreadedForkError`` naming every thread when this (armed) process has more than one;
    ``what``: the fork or spawn about to happen (``"fork the guardian"``)."""
    if not _armed or (threading.active_count() == 1 and len(_task_ids()) <= 1):
        return
    python = ", ".join(t.name for t in threading.enumerate())
    kernel = ", ".join(f"{tid} {_task_name(tid)}" for tid in _task_ids())
    raise ThreadedForkError(
        f"internal error: openclaw-launch is about to {what} with more than one thread (Python's threads: "
        f"{python}; the kernel's: {kernel or 'unknown'}); a fork with threads can leave the child waiting "
        "forever on a lock another thread held. Threaded work belongs in a helper process (run/helper.py); "
        "please report this"
    )


def _task_ids() -> list[str]:
    """This process's threads as the kernel knows them; none where /proc cannot be read (then
    Python's count is the check)."""
    try:
        return os.listdir(_TASKS)
    except OSError:
        return []


def _task_name(tid: str) -> str:
    try:
        with open(f"{_TASKS}/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"
