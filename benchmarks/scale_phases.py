"""The ``phases`` scenario's parts for benchmarks/scale.py: each launcher's output lines stamped with
the time they were read, and what the stamps say (issue 29's start split, the live verdict's latency).

A launcher says ``node rank K of N (by arrival ...)`` once it joined the rendezvous; at
``LOGLEVEL=INFO`` (openclaw_launch/job/info_log.py) ``attempt 0: rendezvous complete`` once the
first node's meeting verdict reached it and its plan is built, and ``rank R started`` as its worker
is spawned (said after the spawn: at times read after the worker ran, so not used); the worker's
ready file has the time it ran. With the harness's own time of each launcher's exec, per launcher
(medians over the launchers):

- ``exec -> arrival``: its own start (interpreter, imports, topology, the join): what a node pays
  alone (on this one machine, while N-1 others start beside it);
- ``arrival -> verdict``: the wait for the others' joins and the first node's verdict: what grows
  with N (``last arrival -> first verdict``: the first node's verdict once the last node joined;
  ``verdict spread``: from the first node to hear it to the last);
- ``verdict -> running``: its plan's rank spawned and its worker's own start: what each node pays
  alone again.
"""

from __future__ import annotations

import itertools
import os
import re
import selectors
import statistics
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

ARRIVED = re.compile(r"node rank \d+ of \d+ \(by arrival")
VERDICT = "attempt 0: rendezvous complete"
NODE_ZERO = "group_rank=0 "
RANK = re.compile(r"global_ranks=\[(\d+)\]")
JOB_LINE = "openclaw-launch: job stats:"
NO_VERDICT = "no verdict this interval"
STORE_NOTE = re.compile(r"warning: job stats: (lost the connection|could not connect|gave up)")


class Stamper:
    """One thread reading every launcher's output pipe; each line goes to its log file with the time it
    was read (``time.time()``, 3 decimals) in front."""

    def __init__(self, pipes: Sequence[IO[bytes]], logs: Sequence[Path]) -> None:
        self._selector = selectors.DefaultSelector()
        for pipe, log in zip(pipes, logs, strict=True):
            self._selector.register(pipe, selectors.EVENT_READ, [log.open("wb"), b""])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._selector.get_map():
            for key, _ in self._selector.select(timeout=1.0):
                out, rest = key.data
                chunk = os.read(key.fd, 65536)
                now = f"{time.time():.3f} ".encode()
                if not chunk:  # the launcher's end: its last partial line too
                    if rest:
                        out.write(now + rest + b"\n")
                    out.close()
                    self._selector.unregister(key.fileobj)
                    continue
                *lines, key.data[1] = (rest + chunk).split(b"\n")
                out.write(b"".join(now + line + b"\n" for line in lines))
                out.flush()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)


def stamped(log: Path) -> list[tuple[float, str]]:
    """The (time read, line) of a stamped log."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        when, _, text = line.partition(" ")
        try:
            out.append((float(when), text))
        except ValueError:
            continue
    return out


def first(
    lines: Sequence[tuple[float, str]], marker: str | re.Pattern[str], since: float = 0.0
) -> tuple[float, str] | None:
    """The first line read after ``since`` that holds ``marker``, and when it was read."""
    for when, text in lines:
        if when >= since and (marker.search(text) if isinstance(marker, re.Pattern) else marker in text):
            return when, text
    return None


def node_zero(logs: Sequence[Path]) -> int | None:
    """The index of the launcher that is node rank 0 (by arrival)."""
    for index, log in enumerate(logs):
        if NODE_ZERO in log.read_text(errors="replace"):
            return index
    return None


def start_split(execs: Sequence[float], logs: Sequence[Path], ready: Mapping[int, float]) -> dict[str, object]:
    """The start split over the launchers (``execs``: each one's exec in the launchers' order, ``ready``:
    each rank's worker's ready time, both ``time.time()``)."""
    lines = [stamped(log) for log in logs]
    arrivals = [first(ls, ARRIVED) for ls in lines]
    verdicts = [first(ls, VERDICT) for ls in lines]
    arrived = [a[0] for a in arrivals if a is not None]
    verdict = [v[0] for v in verdicts if v is not None]
    if len(arrived) < len(lines) or len(verdict) < len(lines):
        return {"split_error": f"{len(lines) - min(len(arrived), len(verdict))} launcher(s) without the lines"}
    ranks = [int(r.group(1)) if v is not None and (r := RANK.search(v[1])) else -1 for v in verdicts]
    if any(r not in ready for r in ranks):
        return {"split_error": "a launcher's rank has no ready file"}
    running = [ready[r] for r in ranks]

    def median(ends: Sequence[float], starts: Sequence[float]) -> float:
        return statistics.median(e - s for e, s in zip(ends, starts, strict=True))

    return {
        "launch_span_s": max(execs) - min(execs),
        "exec_to_arrival_median_s": median(arrived, execs),
        "arrival_to_verdict_median_s": median(verdict, arrived),
        "last_arrival_to_first_verdict_s": min(verdict) - max(arrived),
        "verdict_spread_s": max(verdict) - min(verdict),
        "verdict_to_running_median_s": median(running, verdict),
    }


def has_lines(logs: Sequence[Path]) -> bool:
    """Every launcher's log has the verdict's line (read after its worker ran, at times)."""
    return all(first(stamped(log), VERDICT) is not None for log in logs)


def live_verdict(
    lines: Sequence[tuple[float, str]], naming: re.Pattern[str], slow_at: float, react_s: float
) -> dict[str, object]:
    """From node 0's stamped ``lines``: ``live_s``, the slowdown's start (``slow_at``) to its first job
    line that names the slow rank (``naming``); ``named_before``: its job lines that named any
    straggler before the slowdown."""
    before = sum("job stats:" in text and "; straggler:" in text for when, text in lines if when < slow_at)
    found = first(lines, naming, slow_at)
    if found is None:
        return {"named_before": before, "live_error": f"not named in {react_s:g} s"}
    return {"named_before": before, "live_s": found[0] - slow_at}


def merge(directory: Path, n: int) -> dict[str, object]:
    """``merge_s``: the last worker's exit (its ``exit-RANK`` file) to node 0's job report written (its
    ``job.json``'s mtime)."""
    exits = [float(p.read_text()) for p in directory.glob("exit-*") if not p.name.endswith(".tmp")]
    report = directory / "job.json"
    if len(exits) < n or not report.exists():
        return {"error": f"{len(exits)} of {n} workers' exits, the job report written: {report.exists()}"}
    return {"merge_s": report.stat().st_mtime - max(exits)}


def peers(port: int) -> set[str]:
    """The peers (address:port) of every established server-side connection of ``port`` (the store's):
    one per client connection; the same set later means that nobody connected again."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True, timeout=30
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def held(
    lines: Sequence[tuple[float, str]], logs: Sequence[Path], since: float, now: set[str], before: set[str]
) -> dict[str, object]:
    """Node 0's job lines read from ``since`` (its first judged one) to now: how many, the longest gap
    between two (the window's ends counted), how many said that no verdict came; the store's
    connections now (``now``: its peers) and those that were not there at ``since`` (``before``); the
    launchers' warnings that a job-live connection was lost, refused or given up."""
    until = time.time()
    job = [(when, text) for when, text in lines if since <= when <= until and JOB_LINE in text]
    marks = [since, *(when for when, _ in job), until]
    return {
        "job_lines": len(job),
        "job_line_max_gap_s": max(b - a for a, b in itertools.pairwise(marks)),
        "no_verdict_lines": sum(NO_VERDICT in text for _, text in job),
        "store_conns": len(now),
        "store_conns_new": len(now - before),
        "store_notes": sum(len(STORE_NOTE.findall(log.read_text(errors="replace"))) for log in logs),
    }
