"""Starting one worker of an attempt: its record, its process (pipes, or ptys where the launcher's
stream is a terminal: run/terminal.py), its output streams into the event loop, and the binding it
really runs with read back from /proc.

What follows from a start (the pid watched, the participants and the guardian told, a start that
failed judged as a failure) is the state machine's, run/supervise.py.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import TYPE_CHECKING, Protocol

from openclaw_launch.run.event_loop import EventLoop
from openclaw_launch.run.osproc import OsLayer
from openclaw_launch.run.streams import LauncherStreams
from openclaw_launch.run.worker_output import console_prefix, shown_streams
from openclaw_launch.run.worker_record import AttemptFiles, Logs, WorkerRecord, close_logs, read_back

if TYPE_CHECKING:  # plan.py pulls in config/yaml; spawning only needs the shapes
    from openclaw_launch.plan.model import RankPlan


class SpawnOptions(Protocol):
    """What spawning reads of run/supervise.py's ``SuperviseOptions``."""

    @property
    def console_ranks(self) -> frozenset[int] | None: ...
    @property
    def console_hidden(self) -> frozenset[tuple[int, str]]: ...
    @property
    def prefix_template(self) -> str: ...
    @property
    def readback_delay_s(self) -> float: ...
    @property
    def readback_attempts(self) -> int: ...
    @property
    def stderr_tail_lines(self) -> int: ...


class Spawner:
    """Starts the workers of every attempt of one job."""

    def __init__(
        self, os_layer: OsLayer, loop: EventLoop, streams: LauncherStreams, files: AttemptFiles, options: SpawnOptions
    ) -> None:
        self.os = os_layer
        self.loop = loop
        self.streams = streams
        self.files = files
        self.opt = options
        self.warned_ranks: set[int] = set()  # a binding warning is given once per rank for the job

    def start(self, rank: RankPlan, attempt: int, logs: Logs) -> WorkerRecord:
        """Start ``rank``; the record has no pid when it could not be started (then it has ended,
        as a shell says: 127 or 126, and ``logs`` are closed)."""
        w = WorkerRecord(rank, attempt, self.os.time(), self.os.monotonic(), readbacks_left=self.opt.readback_attempts)
        w.tail = deque(maxlen=self.opt.stderr_tail_lines)
        shown = shown_streams(rank.rank, rank.local_rank, self.opt.console_ranks, self.opt.console_hidden)
        prefix = console_prefix(self.opt.prefix_template, rank, attempt)
        try:
            spawned = self.os.spawn(rank.argv, rank.env, self.loop.terminal_for(shown, prefix))
        except OSError as exc:
            close_logs(logs)
            w.not_started(exc, self.os.time())
            return w
        w.pid = spawned.pid
        for fd, name in ((spawned.stdout_fd, "stdout"), (spawned.stderr_fd, "stderr")):
            if fd is None:
                continue
            tail = w.tail if name == "stderr" else None
            on_log_error = functools.partial(self.files.log_error, f"rank {rank.rank} {name} log")
            stream = self.streams.worker_stream(fd, name, prefix, shown[name], logs[name], tail, on_log_error)
            self.loop.add_stream(stream)
        read_back(w, self.os, self.loop.at, self.opt.readback_delay_s, self._binding_warning)
        return w

    def _binding_warning(self, w: WorkerRecord, warning: str) -> None:
        if w.rank.rank not in self.warned_ranks:
            self.warned_ranks.add(w.rank.rank)
            self.streams.say(f"openclaw-launch: warning: {warning}")
