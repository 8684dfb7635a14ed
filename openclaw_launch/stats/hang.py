"""Hang detection (``--hang-timeout-s``): name the rank that stopped, show its stack, end the job.

``HangWatch`` is pure (a clock passed in): it turns the statistics channel (step batches and the
progress datagrams of ``wire.Progress``) into per-rank "last step at, in phase X since T", and
judges. A rank is armed after its first step. When an armed rank has had no step for the timeout,
the job hangs; every rank without a step for the timeout is listed, and the *stuck* ones are those
not waiting for peers (not in a collective or ``sync`` phase): the ranks the others wait for. When
every silent rank waits in a collective (a mismatched collective, a dead peer on another node),
all of them are named. A straggler keeps stepping, slowly, and is never a hang.

``HangMonitor`` runs it from the supervisor's periodic hook and does the effects, never blocking
the loop: it sends the stack-dump signal the bootstrap's faulthandler listens for (or runs
``py-spy dump`` in a thread when py-spy is installed), waits a bounded time for the stacks, appends
each rank's stack to its stderr log, prints the stuck ranks' stacks on the console, and then asks
the supervisor to stop the job with ``HANG_EXIT_CODE``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openclaw_launch.telemetry import wire

HANG_EXIT_CODE = 124  # as timeout(1): the job was stopped because it made no progress
CHECK_INTERVAL_S = 0.25  # how often the supervisor asks
PROGRESS_INTERVAL_S = 0.5  # how often a worker's progress thread looks for news (telemetry/recorder.py)
SIGNAL_WAIT_S = 1.0  # faulthandler writes at once; the console and the file get this long
PY_SPY_TIMEOUT_S = 10.0  # py-spy on a process in a bad state may be slow: never longer than this
MAX_STACK_BYTES = 256 << 10  # read of one rank's stack file
NO_STEP_NOTICE_S = 30.0  # with no step from any rank this long (or the timeout, if longer): say why nothing fires
EXCERPT_LINES = 40  # of a rank's stack, in the report and on the console
WAIT_PHASES = frozenset({wire.COLLECTIVE, wire.SYNC})


@dataclass
class _Rank:
    rank: int
    local_rank: int
    node: str
    steps: int = 0  # step boundaries seen
    last_step: float | None = None  # monotonic time of the last boundary (launcher clock)
    phase: str | None = None
    phase_since: float | None = None
    collective: str | None = None
    dump_signal: int | None = None
    pid: int | None = None
    finished: bool = False
    sync_phases: set[str] = field(default_factory=lambda: set(WAIT_PHASES))


@dataclass(frozen=True)
class RankHang:
    """One rank at the moment of the verdict."""

    rank: int
    local_rank: int
    node: str
    stuck: bool  # the others wait for it (False: it waits for peers, or it was still stepping)
    steps: int
    no_step_s: float | None  # seconds since its last step (None: it never stepped)
    phase: str  # what it was doing: a phase name, or "other" outside every phase
    in_phase_s: float | None
    collective: str | None
    pid: int | None

    def describe(self) -> str:
        what = self.phase
        if self.phase == wire.COLLECTIVE and self.collective:
            what = f"collective {self.collective}"
        text = f"rank {self.rank} (local rank {self.local_rank}, node {self.node}"
        text += f", pid {self.pid})" if self.pid else ")"
        if self.in_phase_s is not None:
            text += f" in {what} for {self.in_phase_s:.1f} s"
        else:
            text += f" in {what}"
        if self.no_step_s is None:
            text += ", no step yet"
        else:
            text += f", last step {self.no_step_s:.1f} s ago (step {self.steps})"
        if self.collective and self.phase != wire.COLLECTIVE:
            text += f", last collective {self.collective}"
        return text


@dataclass(frozen=True)
class Verdict:
    ranks: tuple[RankHang, ...]  # every rank without a step for the timeout, stuck ones first
    all_silent: bool  # no rank progressed for the timeout

    @property
    def stuck(self) -> tuple[RankHang, ...]:
        return tuple(r for r in self.ranks if r.stuck)


class HangWatch:
    def __init__(self, timeout_s: float, ranks: Iterable[tuple[int, int, str]]) -> None:
        self.timeout_s = timeout_s
        self._plan = list(ranks)  # (rank, local_rank, node)
        self.ranks: dict[int, _Rank] = {}
        self.started = 0.0
        self.reset(0.0)

    def reset(self, now: float) -> None:
        """A new attempt: nothing is armed."""
        self.started = now
        self.ranks = {r: _Rank(r, lr, node) for r, lr, node in self._plan}

    @property
    def any_step(self) -> bool:
        return any(r.steps for r in self.ranks.values())

    def on_batch(self, batch: wire.Batch, now: float) -> None:
        r = self.ranks.get(batch.rank)
        if r is None:
            return
        r.sync_phases.update(batch.sync_phases)
        if batch.final:
            r.finished = True
        elif batch.steps:  # sent at a step boundary
            r.steps += len(batch.steps) + (1 if r.steps == 0 else 0)  # n step times = n + 1 boundaries
            r.last_step = now if r.last_step is None else max(r.last_step, now)

    def on_progress(self, p: wire.Progress, now: float) -> None:
        r = self.ranks.get(p.rank)
        if r is None:
            return
        r.steps = max(r.steps, p.steps)
        if p.step_age_s is not None:
            at = now - p.step_age_s
            r.last_step = at if r.last_step is None else max(r.last_step, at)
        r.phase, r.phase_since = p.phase, now - p.phase_age_s
        r.collective = p.collective or r.collective
        r.dump_signal, r.pid = p.dump_signal, p.pid or r.pid

    def check(self, now: float) -> Verdict | None:
        live = [r for r in self.ranks.values() if not r.finished]
        armed = [r for r in live if r.last_step is not None]
        if not any(now - (r.last_step if r.last_step is not None else now) >= self.timeout_s for r in armed):
            return None

        def silent(r: _Rank) -> bool:
            return now - (r.last_step if r.last_step is not None else self.started) >= self.timeout_s

        quiet = [r for r in live if silent(r)]
        all_silent = len(quiet) == len(live)
        culprits = {r.rank for r in quiet if (r.phase or "") not in r.sync_phases} or {r.rank for r in quiet}
        out = [
            RankHang(
                rank=r.rank,
                local_rank=r.local_rank,
                node=r.node,
                stuck=r.rank in culprits,
                steps=r.steps,
                no_step_s=None if r.last_step is None else round(now - r.last_step, 3),
                phase=r.phase or "other",
                in_phase_s=None if r.phase_since is None else round(now - r.phase_since, 3),
                collective=r.collective,
                pid=r.pid,
            )
            for r in quiet
        ]
        out.sort(key=lambda h: (not h.stuck, h.rank))
        return Verdict(tuple(out), all_silent)


# ---- effects -------------------------------------------------------------------------------------


class PySpy:
    """``py-spy dump --pid`` per rank, each in a thread that only runs it and reads its pipe."""

    def __init__(self, exe: str, timeout_s: float = PY_SPY_TIMEOUT_S) -> None:
        self.exe = exe
        self.timeout_s = timeout_s
        self.out: dict[int, str] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @staticmethod
    def find() -> PySpy | None:
        exe = shutil.which("py-spy")
        return PySpy(exe) if exe else None

    def start(self, rank: int, pid: int) -> None:
        t = threading.Thread(target=self._run, args=(rank, pid), name=f"openclaw-py-spy-{rank}", daemon=True)
        self._threads.append(t)
        t.start()

    def _run(self, rank: int, pid: int) -> None:
        try:
            done = subprocess.run(
                [self.exe, "dump", "--pid", str(pid)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout_s,
                check=False,
            )
            text = done.stdout.decode(errors="replace") or done.stderr.decode(errors="replace")
        except (OSError, subprocess.SubprocessError) as exc:
            text = f"(py-spy failed: {exc})"
        with self._lock:
            self.out[rank] = text[:MAX_STACK_BYTES]

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def take(self) -> dict[int, str]:
        with self._lock:
            return dict(self.out)


def read_stack_file(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_STACK_BYTES).decode(errors="replace")
    except OSError:
        return ""


def excerpt(text: str, lines: int = EXCERPT_LINES) -> list[str]:
    """The first ``lines`` lines of a stack dump, the thread that took the signal (faulthandler's
    "Current thread", the main one) or py-spy's MainThread first."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" ") or not blocks:
            blocks.append([])
        blocks[-1].append(line.rstrip())
    blocks.sort(key=lambda b: not (b[0].startswith("Current thread") or "MainThread" in b[0]))
    out = [line for block in blocks for line in block]
    return out[:lines] + ([f"... ({len(out) - lines} more line(s) in the rank's log)"] if len(out) > lines else [])


@dataclass
class HangOs:
    """What the monitor does to the world; tests replace it."""

    kill: Callable[[int, int], None] = os.kill
    monotonic: Callable[[], float] = time.monotonic
    find_py_spy: Callable[[], PySpy | None] = PySpy.find


class HangMonitor:
    """Detect -> dump stacks -> report -> ask the supervisor to stop (``stop_code``)."""

    def __init__(
        self,
        watch: HangWatch,
        say: Callable[[str], None],
        stack_files: Mapping[int, str],
        log_path: Callable[[int], str | None],
        os_: HangOs | None = None,
    ) -> None:
        self.watch = watch
        self._say = say
        self._stack_files = dict(stack_files)  # rank -> the faulthandler's file
        self._log_path = log_path  # rank -> its stderr log of this attempt (None: no logs)
        self.os = os_ or HangOs()
        self.verdict: Verdict | None = None
        self.stacks: dict[int, str] = {}
        self.stack_source: str | None = None
        self.detected_at: float | None = None
        self._deadline = 0.0
        self._py_spy: PySpy | None = None
        self._state = "watching"  # -> dumping -> stop
        self._told_no_source = False

    def before_attempt(self) -> None:
        if self._state == "watching":
            self.watch.reset(self.os.monotonic())

    def on_datagram(self, item: wire.Batch | wire.Progress) -> None:
        now = self.os.monotonic()
        if isinstance(item, wire.Progress):
            self.watch.on_progress(item, now)
        else:
            self.watch.on_batch(item, now)

    def tick(self) -> None:
        now = self.os.monotonic()
        if self._state == "watching":
            self._watch(now)
        elif self._state == "dumping" and (now >= self._deadline or self._dumps_done()):
            self._collect()
            self._state = "stop"

    def stop_code(self) -> int | None:
        return HANG_EXIT_CODE if self._state == "stop" else None

    def _watch(self, now: float) -> None:
        waited = now - self.watch.started
        if (
            not self._told_no_source
            and not self.watch.any_step
            and waited >= max(self.watch.timeout_s, NO_STEP_NOTICE_S)
        ):
            self._told_no_source = True
            self._say(
                f"openclaw-launch: warning: --hang-timeout-s: no rank has reported a step in {waited:.0f} s; "
                "hang detection arms at each rank's first step, so it never fires for workers that use "
                "neither torch's optimizer (the zero-code hooks) nor telemetry.step()"
            )
        verdict = self.watch.check(now)
        if verdict is None:
            return
        self.verdict, self.detected_at = verdict, now
        how = "no rank made progress" if verdict.all_silent else "the other ranks kept stepping"
        lines = [f"openclaw-launch: hang: no step for {self.watch.timeout_s:g} s ({how}); stuck:"]
        lines += [f"  {h.describe()}" for h in verdict.stuck]
        waiting = [h for h in verdict.ranks if not h.stuck]
        if waiting:
            lines.append("  waiting for it:" if len(verdict.stuck) == 1 else "  waiting for them:")
            lines += [f"    {h.describe()}" for h in waiting]
        self._say("\n".join(lines))
        self._start_dumps(now)

    def _start_dumps(self, now: float) -> None:
        """Every rank's stack, the running ones too (their stacks show what they wait in)."""
        ranks = [r for r in self.watch.ranks.values() if r.pid and not r.finished]
        self._py_spy = self.os.find_py_spy()
        if self._py_spy is not None:
            self.stack_source = "py-spy"
            for r in ranks:
                self._py_spy.start(r.rank, r.pid or 0)
            self._deadline = now + self._py_spy.timeout_s + 0.5
        else:
            sent = False
            for r in ranks:
                if r.dump_signal is None:
                    continue
                try:
                    self.os.kill(r.pid or 0, r.dump_signal)
                    sent = True
                except OSError:
                    pass
            self.stack_source = "faulthandler" if sent else None
            self._deadline = now + (SIGNAL_WAIT_S if sent else 0.0)
        self._state = "dumping"

    def _dumps_done(self) -> bool:
        return self._py_spy is not None and self._py_spy.done()

    def _collect(self) -> None:
        if self._py_spy is not None:
            self.stacks = self._py_spy.take()
        elif self.stack_source == "faulthandler":
            self.stacks = {r: read_stack_file(p) for r, p in self._stack_files.items() if r in self.watch.ranks}
        self.stacks = {r: t for r, t in self.stacks.items() if t.strip()}
        for rank, text in sorted(self.stacks.items()):
            path = self._log_path(rank)
            if path:
                try:
                    with open(path, "ab") as f:  # O_APPEND: interleaves by whole writes with the supervisor's
                        f.write(f"openclaw-launch: hang: stacks of rank {rank} ({self.stack_source}):\n{text}".encode())
                except OSError:
                    pass
        verdict = self.verdict
        if verdict is None:
            return
        lines: list[str] = []
        for h in verdict.stuck:
            stack = self.stacks.get(h.rank)
            if stack:
                lines.append(f"openclaw-launch: hang: stack of rank {h.rank} ({self.stack_source}):")
                lines += [f"  {line}" for line in excerpt(stack)]
        if not self.stacks:
            lines.append(
                "openclaw-launch: hang: no stacks (install py-spy, or run the workers under the bootstrap: "
                "--telemetry hooks/full/api)"
            )
        lines.append(f"openclaw-launch: hang: stopping the job (exit code {HANG_EXIT_CODE})")
        self._say("\n".join(lines))

    def to_json(self) -> dict[str, Any] | None:
        """The report's ``hang`` object (docs/report-format.md); None when there was no hang."""
        if self.verdict is None:
            return None
        return {
            "timeout_s": self.watch.timeout_s,
            "exit_code": HANG_EXIT_CODE,
            "all_silent": self.verdict.all_silent,
            "stack_source": self.stack_source,
            "ranks": [
                {
                    "rank": h.rank,
                    "local_rank": h.local_rank,
                    "node": h.node,
                    "pid": h.pid,
                    "stuck": h.stuck,
                    "steps": h.steps,
                    "no_step_s": h.no_step_s,
                    "phase": h.phase,
                    "in_phase_s": h.in_phase_s,
                    "collective": h.collective,
                    "stack": excerpt(self.stacks.get(h.rank, "")),
                }
                for h in self.verdict.ranks
            ],
        }
