"""The effects of hang detection: ``HangMonitor`` runs ``stats.hang.HangWatch`` on a timer of the
supervisor and never blocks the loop: it sends the stack-dump signal the bootstrap's faulthandler
listens for (or starts ``py-spy dump`` when py-spy is installed), waits a bounded time for
the stacks, appends each rank's stack to its stderr log, prints the stuck ranks' stacks on the
console, and then gives the supervisor its stop reason: a hang, ``HANG_EXIT_CODE``, never restarted.

It is a supervision participant (run/participant.py): every attempt starts it afresh (nothing armed,
no verdict), it watches only while the attempt runs (a rank that stops stepping because the node is
stopping is no hang), and it votes against a restart once it has a verdict in the attempt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import IO, TYPE_CHECKING

from openclaw_launch.run.participant import Participant, StopKind, StopReason, Timer
from openclaw_launch.safe_read import read_untrusted
from openclaw_launch.single_thread import assert_single_threaded
from openclaw_launch.stats.hang import (
    CHECK_INTERVAL_S,
    EXCERPT_LINES,
    HANG_EXIT_CODE,
    MAX_STACK_BYTES,
    NO_STEP_NOTICE_S,
    PY_SPY_TIMEOUT_S,
    SIGNAL_WAIT_S,
    HangWatch,
)
from openclaw_launch.telemetry import wire

if TYPE_CHECKING:
    from openclaw_launch.plan.model import RankPlan
    from openclaw_launch.stats.result import Hang


class PySpy:
    """``py-spy dump --pid`` per rank, started from the supervisor's own thread (the launcher forks
    and spawns with one thread: run/helper.py) with its output in unlinked temporary files; ``done``
    polls them and kills one still running after ``timeout_s``."""

    def __init__(self, exe: str, timeout_s: float = PY_SPY_TIMEOUT_S) -> None:
        self.exe = exe
        self.timeout_s = timeout_s
        self._runs: dict[int, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes], float]] = {}
        self._failed: dict[int, str] = {}  # rank -> why its dump has no stack

    @staticmethod
    def find() -> PySpy | None:
        exe = shutil.which("py-spy")
        return PySpy(exe) if exe else None

    def start(self, rank: int, pid: int) -> None:
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (closed in take)
        argv = [self.exe, "dump", "--pid", str(pid)]
        assert_single_threaded("start py-spy")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as exc:
            out.close()
            err.close()
            self._failed[rank] = f"(py-spy failed: {exc})"
            return
        self._runs[rank] = (proc, out, err, time.monotonic() + self.timeout_s)

    def done(self) -> bool:
        """Whether every dump has ended (the supervisor may have reaped it: Popen then reads 0)."""
        now = time.monotonic()
        running = False
        for rank, (proc, _, _, deadline) in self._runs.items():
            if proc.poll() is None:
                if now >= deadline:
                    self._kill(rank, proc)
                running = True
        return not running

    def _kill(self, rank: int, proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        self._failed[rank] = f"(py-spy failed: no answer within {self.timeout_s:g} s)"

    def take(self) -> dict[int, str]:
        """Each rank's dump (stdout, else stderr); one still running is killed and said so."""
        texts: dict[int, str] = {}
        for rank, (proc, out, err, _) in self._runs.items():
            if proc.poll() is None:
                self._kill(rank, proc)
            for f in (out, err):
                f.seek(0)
                texts[rank] = texts.get(rank) or f.read(MAX_STACK_BYTES).decode(errors="replace")
                f.close()
        self._runs = {}
        return {**texts, **self._failed}


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
    alive: Callable[[int], bool] = lambda pid: _alive(pid)
    catches: Callable[[int, int], bool] = lambda pid, sig: _catches(pid, sig)
    monotonic: Callable[[], float] = time.monotonic
    find_py_spy: Callable[[], PySpy | None] = PySpy.find


def _alive(pid: int) -> bool:
    """The process is there (a zombie too: the supervisor reaps its children at its next step)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _catches(pid: int, sig: int) -> bool:
    """The process has a handler for ``sig`` (``SigCgt`` in /proc): past the interpreter's end (a C
    exit handler) faulthandler's is gone, and the signal's default would kill the rank. True when
    /proc does not say."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read(16 << 10).decode(errors="replace")
        mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(mask, 16) >> (sig - 1) & 1)
    except (OSError, StopIteration, IndexError, ValueError):
        return True


def watched(ranks: Iterable[RankPlan]) -> list[tuple[int, int, str]]:
    """What the hang watch keeps of each rank: (rank, local rank, node)."""
    return [(r.rank, r.local_rank, r.node) for r in ranks]


def stack_files(ranks: Iterable[RankPlan]) -> dict[int, str]:
    """Each rank's stack file, as its environment names it (the plan's ``OPENCLAW_STACKS_FILE``)."""
    return {r.rank: r.env[wire.STACKS_ENV] for r in ranks if r.env.get(wire.STACKS_ENV)}


class HangMonitor(Participant):
    """Detect -> dump stacks -> report -> stop reason (states: watching -> dumping -> stop; off once
    the node stops for another reason)."""

    def __init__(
        self,
        watch: HangWatch,
        say: Callable[[str], None],
        stack_files: Mapping[int, str],
        log_path: Callable[[int, int], str | None],
        os_: HangOs | None = None,
    ) -> None:
        self.watch = watch
        self._say = say
        self._stack_files = dict(stack_files)  # rank -> the faulthandler's file
        self._log_path = log_path  # (rank, attempt) -> its stderr log (None: no logs)
        self.os = os_ or HangOs()
        self.attempt = 0
        self.begin_attempt(0)

    # ---- the attempt contract (run/participant.py) ------------------------------------------------

    def begin_attempt(self, attempt: int) -> None:
        """Nothing of the previous attempt survives: no armed rank, no verdict, no stop."""
        self.attempt = attempt
        self.watch.reset(self.os.monotonic())
        self.verdict: Hang | None = None
        self.stacks: dict[int, str] = {}
        self.stack_source: str | None = None
        self.detected_at: float | None = None
        self._deadline = 0.0
        self._py_spy: PySpy | None = None
        self._state = "watching"  # -> dumping -> stop; or off
        self._told_no_source = False
        self._no_handler: list[int] = []  # ranks in their exit without a stack-signal handler any more

    def begin_ranks(self, attempt: int, ranks: tuple[RankPlan, ...]) -> None:
        """The attempt's ranks (an elastic job's new world renumbers them): watched, and their stack
        files."""
        self.watch.set_ranks(watched(ranks))
        self._stack_files = stack_files(ranks)

    def timers(self) -> list[Timer]:
        return [(CHECK_INTERVAL_S, self.tick)]

    def stop_reason(self) -> StopReason | None:
        if self._state != "stop" or self.verdict is None:
            return None
        stuck = self.verdict.stuck or self.verdict.ranks
        text = f"{self._headline()}; stuck: " + "; ".join(h.describe() for h in stuck)
        if self.verdict.cause is not None:
            text += f"; cause: {self.verdict.cause.text}"
        first = stuck[0] if stuck else None
        return StopReason(
            StopKind.HANG, HANG_EXIT_CODE, text, False, first.node if first else None, first.rank if first else None
        )

    def on_stop(self, reason: StopReason) -> None:
        """The node stops for another reason: watch no more; a verdict already taken still stands
        (its stacks as far as they came), so that the attempt is not restarted."""
        if self._state == "dumping":
            self._collect()
            self._state = "stop"
        elif self._state == "watching":
            self._state = "off"

    def vote_restart(self, attempt: int, wish: bool) -> bool:
        return wish and self.verdict is None

    # ---- the watch -------------------------------------------------------------------------------

    def on_spawn(self, rank: int, pid: int) -> None:
        self.watch.on_spawn(rank, pid)

    def on_datagram(self, item: wire.Batch | wire.Progress) -> None:
        now = self.os.monotonic()
        if isinstance(item, wire.Progress):
            self.watch.on_progress(item, now)
        else:
            self.watch.on_batch(item, now)

    def tick(self) -> None:
        now = self.os.monotonic()
        if self._state == "watching":
            self._note_exits()
            self._watch(now)
        elif self._state == "dumping" and (now >= self._deadline or self._dumps_done()):
            self._collect()
            self._state = "stop"

    def _note_exits(self) -> None:
        """A rank that said it was done is watched until its process is gone (a hang in its exit)."""
        for rank in self.watch.in_exit():
            pid = self.watch.ranks[rank].pid
            if pid is None or pid <= 0 or not self.os.alive(pid):
                self.watch.on_exit(rank)

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
        lines = [f"openclaw-launch: {self._headline()} ({how}); stuck:"]
        lines += [f"  {h.describe()}" for h in verdict.stuck]
        waiting = [h for h in verdict.ranks if not h.stuck]
        if waiting:
            lines.append("  waiting for it:" if len(verdict.stuck) == 1 else "  waiting for them:")
            lines += [f"    {h.describe()}" for h in waiting]
        if verdict.cause is not None:
            lines.append(f"openclaw-launch: hang: cause: {verdict.cause.text}")
        self._say("\n".join(lines))
        self._start_dumps(now)

    def _headline(self) -> str:
        if self.verdict is not None and self.verdict.startup:
            return f"hang: no first step within the start-up allowance of {self.watch.startup_timeout_s:g} s"
        return f"hang: no step for {self.watch.timeout_s:g} s"

    def _start_dumps(self, now: float) -> None:
        """Every rank's stack, the running ones too (their stacks show what they wait in)."""
        # Only the processes this launcher spawned (on_spawn), with the signal it chose: never what a datagram says.
        ranks = [r for r in self.watch.ranks.values() if r.pid is not None and r.pid > 0 and not r.exited]
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
                if r.finished and not self.os.catches(r.pid or 0, wire.dump_signal()):
                    self._no_handler.append(r.rank)
                    continue
                try:
                    self.os.kill(r.pid or 0, wire.dump_signal())
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
            self.stacks = {
                r: read_untrusted(p, MAX_STACK_BYTES, self._say) or ""
                for r, p in self._stack_files.items()
                if r in self.watch.ranks
            }
        self.stacks = {r: t for r, t in self.stacks.items() if t.strip()}
        for rank, text in sorted(self.stacks.items()):
            path = self._log_path(rank, self.attempt)
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
        for h in verdict.ranks if verdict.startup else verdict.stuck:  # at start-up: every rank's
            stack = self.stacks.get(h.rank)
            if stack:
                lines.append(f"openclaw-launch: hang: stack of rank {h.rank} ({self.stack_source}):")
                lines += [f"  {line}" for line in excerpt(stack)]
        for rank in self._no_handler:
            lines.append(
                f"openclaw-launch: hang: rank {rank} is past its interpreter's end (no handler for the stack "
                "signal: a C exit handler or a library's teardown); no Python stack, py-spy --native shows its C one"
            )
        if not self.stacks and not self._no_handler:
            lines.append(
                "openclaw-launch: hang: no stacks (install py-spy; without it the stacks come from the "
                "bootstrap's faulthandler, which runs only in Python workers the launcher starts, not --no-python)"
            )
        lines.append(f"openclaw-launch: hang: stopping the job (exit code {HANG_EXIT_CODE})")
        self._say("\n".join(lines))

    def result(self) -> Hang | None:
        """The report's ``hang`` (docs/report-format.md): the verdict with its stacks; None when
        there was no hang."""
        if self.verdict is None:
            return None
        ranks = tuple(replace(h, stack=tuple(excerpt(self.stacks.get(h.rank, "")))) for h in self.verdict.ranks)
        return replace(self.verdict, stack_source=self.stack_source, ranks=ranks)
