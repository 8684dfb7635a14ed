"""Hang detection (``--hang-timeout-s``): name the rank that stopped, show its stack, end the job.

``HangWatch`` is pure (a clock passed in): it turns the statistics channel (step batches and the
progress datagrams of ``wire.Progress``) into per-rank "last step at, in phase X since T", and
judges. A rank is armed after its first step. When an armed rank has had no step for the timeout,
the job hangs; every rank without a step for the timeout is listed, and the *stuck* ones are those
not waiting for peers (not in a collective or ``sync`` phase): the ranks the others wait for. When
every silent rank waits in a collective (a mismatched collective, a dead peer on another node),
all of them are named. A straggler keeps stepping, slowly, and is never a hang. With
``startup_timeout_s``, a rank without a first step that long after the attempt began is a hang too.
A rank that said it was done (its final batch, sent at its exit) and whose process is still there
after the timeout hangs in its exit (phase ``exit``: an exit handler, NCCL's or CUDA's teardown).

The *cause* (``HangCause``) says who the others wait for: with torch's flight recorder, the ranks
that never entered the collective the others wait in (torch's analyser matches ranks by
``collective_seq_id``: the members without the newest number did not join it); else the ranks
outside every waiting phase while the others wait in one; when every host waits, the ranks whose GPU
never passed a mark (``telemetry/gpu_events.GpuProgress``) the others' GPUs passed (a kernel that
does not end). With NCCL a rank blocked in ``backward``
or in a host wait on the GPU (``device-wait``: ``.item()``, ``synchronize``) waits on its stream for
the all-reduce (enqueued, not waited for, by the CPU): it waits, it is not stuck; the backend is the
script's own default group's, as the rank reports it.

Steps: a step ends at each boundary (``telemetry.step()``, ``optimizer.step()``), so a rank with N
boundaries made N steps, the number the collector's batches count; the progress
datagrams carry the same count (one source, the worker's boundary counter).

The effects (signals, py-spy, logs, the console) are in ``stats/hang_monitor.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openclaw_launch import exit_codes
from openclaw_launch.telemetry import gpu_events, wire

if TYPE_CHECKING:
    from openclaw_launch.stats.result import Hang, HangCause

HANG_EXIT_CODE = exit_codes.HANG  # 124, as timeout(1): the job was stopped because it made no progress
CHECK_INTERVAL_S = 0.25  # how often the supervisor asks
SIGNAL_WAIT_S = 1.0  # faulthandler writes at once; the console and the file get this long
PY_SPY_TIMEOUT_S = 10.0  # py-spy on a process in a bad state may be slow: never longer than this
MAX_STACK_BYTES = 256 << 10  # read of one rank's stack file
NO_STEP_NOTICE_S = 30.0  # with no step from any rank this long (or the timeout, if longer): say why nothing fires
EXCERPT_LINES = 40  # of a rank's stack, in the report and on the console
EXIT_PHASE = "exit"  # a rank that said it was done and did not exit: in its exit handlers or teardown
WAIT_PHASES = frozenset({wire.COLLECTIVE, wire.SYNC, wire.RENDEZVOUS})
# With NCCL the CPU waits on its GPU's stream, behind the all-reduce there, in DDP's backward and in
# the host's waits on the GPU (``.item()``, ``synchronize``, copies to host: ``device-wait``). Known
# from the backend alone: a rank that hangs before its first batch (which lists its wait phases) came.
GPU_WAIT_PHASES = frozenset({wire.BACKWARD, wire.DEVICE_WAIT})


@dataclass
class _Rank:
    rank: int
    local_rank: int
    node: str
    steps: int = 0  # steps (boundaries): the most of the progress count and the batches' steps
    batch_steps: int = 0  # steps in the batches received
    last_step: float | None = None  # monotonic time of the last boundary (launcher clock)
    phase: str | None = None
    phase_since: float | None = None
    collective: str | None = None
    dump_signal: int | None = None
    pid: int | None = None
    finished: bool = False  # it said it was done (its final batch, at its exit)
    finished_at: float | None = None
    exited: bool = False  # its process is gone (the monitor looks: stats/hang_monitor.py)
    sync_phases: set[str] = field(default_factory=lambda: set(WAIT_PHASES))
    backend: str | None = None
    last_collectives: tuple[wire.LastCollective, ...] = ()
    gpu: tuple[int, int] | None = None  # (GPU passed, host recorded) positions (gpu_events.position)

    def waits(self) -> bool:
        """In a phase that waits for peers (the one rule for "stuck" and for the cause)."""
        phase = self.phase or ""
        return phase in self.sync_phases or (self.backend == "nccl" and phase in GPU_WAIT_PHASES)


class HangWatch:
    def __init__(
        self, timeout_s: float, ranks: Iterable[tuple[int, int, str]], startup_timeout_s: float | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s  # None: no start-up allowance (armed at a first step)
        self._plan = list(ranks)  # (rank, local_rank, node)
        self.ranks: dict[int, _Rank] = {}
        self.started = 0.0
        self.reset(0.0)

    def reset(self, now: float) -> None:
        """A new attempt: nothing is armed."""
        self.started = now
        self.ranks = {r: _Rank(r, lr, node) for r, lr, node in self._plan}

    def set_ranks(self, ranks: Iterable[tuple[int, int, str]]) -> None:
        """The attempt's (rank, local rank, node), before it spawns (an elastic job's new world):
        only these are watched; nothing is armed."""
        self._plan = list(ranks)
        self.reset(self.started)

    @property
    def any_step(self) -> bool:
        return any(r.steps for r in self.ranks.values())

    def on_batch(self, batch: wire.Batch, now: float) -> None:
        r = self.ranks.get(batch.rank)
        if r is None:
            return
        r.sync_phases.update(batch.sync_phases)
        r.batch_steps += len(batch.steps)
        r.steps = max(r.steps, r.batch_steps)
        if batch.final:
            r.finished = True
            r.finished_at = now if r.finished_at is None else r.finished_at

    def on_exit(self, rank: int) -> None:
        """The rank's process is gone: after its final batch, nothing more to watch."""
        r = self.ranks.get(rank)
        if r is not None:
            r.exited = True

    def in_exit(self) -> list[int]:
        """The ranks that said they were done and whose process may still run."""
        return [r.rank for r in self.ranks.values() if r.finished and not r.exited]

    def on_spawn(self, rank: int, pid: int) -> None:
        """The pid the launcher spawned for the rank: the only one signalled or shown for it (a
        datagram names none: the channel is untrusted input, stats/inbox.py)."""
        r = self.ranks.get(rank)
        if r is not None:
            r.pid = pid

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
        r.dump_signal = p.dump_signal
        r.backend = p.backend or r.backend
        r.last_collectives = p.last_collectives or r.last_collectives
        r.gpu = p.gpu or r.gpu

    def check(self, now: float) -> Hang | None:
        """The hang, when there is one (its stacks are the monitor's to add: stats/hang_monitor.py)."""
        live = [r for r in self.ranks.values() if not r.finished]
        armed = [r for r in live if r.last_step is not None]
        startup = (
            self.startup_timeout_s is not None
            and now - self.started >= self.startup_timeout_s
            and any(r.last_step is None for r in live)
        )
        hung = any(now - (r.last_step if r.last_step is not None else now) >= self.timeout_s for r in armed)
        if not hung and not startup:
            return self._exit_hang(now)
        # the report's types load at a hang, not with the watch at start-up (stats/result.py)
        from openclaw_launch.stats.result import Hang, HangRank

        def silent(r: _Rank) -> bool:
            return now - (r.last_step if r.last_step is not None else self.started) >= self.timeout_s

        quiet = [r for r in live if silent(r) or (startup and not hung and r.last_step is None)]
        all_silent = len(quiet) == len(live)
        cause = _cause(quiet, startup and not hung)
        culprits = set(cause.ranks)
        out = [
            HangRank(
                rank=r.rank,
                local_rank=r.local_rank,
                node=r.node,
                pid=r.pid,
                stuck=r.rank in culprits,
                steps=r.steps,
                no_step_s=None if r.last_step is None else round(now - r.last_step, 3),
                phase=r.phase or "other",
                in_phase_s=None if r.phase_since is None else round(now - r.phase_since, 3),
                collective=r.collective,
                stack=(),
            )
            for r in quiet
        ]
        out.sort(key=lambda h: (not h.stuck, h.rank))
        return Hang(
            timeout_s=self.timeout_s,
            exit_code=HANG_EXIT_CODE,
            all_silent=all_silent,
            stack_source=None,
            ranks=tuple(out),
            startup_timeout_s=self.startup_timeout_s,
            startup=startup and not hung,
            cause=cause,
        )

    def _exit_hang(self, now: float) -> Hang | None:
        """A rank that said it was done (its final batch) and has not exited ``timeout_s`` later: it
        hangs in its exit (an exit handler, NCCL's or CUDA's teardown, a C ``atexit``)."""
        stuck = [
            r
            for r in self.ranks.values()
            if r.finished and not r.exited and r.finished_at is not None and now - r.finished_at >= self.timeout_s
        ]
        if not stuck:
            return None
        from openclaw_launch.stats.result import Hang, HangCause, HangRank

        since = min(now - (r.finished_at or now) for r in stuck)
        text = (
            f"{_ranks(r.rank for r in stuck)} said {'it was' if len(stuck) == 1 else 'they were'} done (a final "
            f"batch {since:.0f} s ago) and never exited: stuck in {_own(stuck)} exit (an exit handler or "
            "teardown: atexit, NCCL's or CUDA's)"
        )
        cause = HangCause("outside", tuple(sorted(r.rank for r in stuck)), (), None, None, EXIT_PHASE, text)
        out = tuple(
            HangRank(
                rank=r.rank,
                local_rank=r.local_rank,
                node=r.node,
                pid=r.pid,
                stuck=True,
                steps=r.steps,
                no_step_s=None if r.last_step is None else round(now - r.last_step, 3),
                phase=EXIT_PHASE,
                in_phase_s=round(now - (r.finished_at or now), 3),
                collective=None,
                stack=(),
            )
            for r in sorted(stuck, key=lambda r: r.rank)
        )
        return Hang(
            timeout_s=self.timeout_s,
            exit_code=HANG_EXIT_CODE,
            all_silent=False,
            stack_source=None,
            ranks=out,
            startup_timeout_s=self.startup_timeout_s,
            startup=False,
            cause=cause,
        )


def _ranks(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    return ("rank " if len(listed) == 1 else "ranks ") + ", ".join(map(str, listed))


def _verb(ranks: Sized) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def _own(ranks: Sized) -> str:
    return "its own" if len(ranks) == 1 else "their own"


def _waited_in(ranks: Iterable[_Rank]) -> str:
    names = sorted(
        {(r.collective if r.phase == wire.COLLECTIVE and r.collective else r.phase or "other") for r in ranks}
    )
    return ", ".join(names)


def _not_entered(quiet: list[_Rank]) -> HangCause | None:
    """torch's flight-recorder rule: in a process group, the ranks whose newest collective is older
    than the one the others wait in never entered it."""
    groups = sorted({c.group for r in quiet for c in r.last_collectives})
    for group in groups:
        last = {r.rank: c for r in quiet for c in r.last_collectives if c.group == group}
        newest = max(c.seq for c in last.values())
        waiting = {rank for rank, c in last.items() if c.seq == newest and not c.done}
        behind = {rank for rank, c in last.items() if c.seq < newest}
        if waiting and behind:
            from openclaw_launch.stats.result import HangCause

            op = next(c.op for rank, c in last.items() if rank in waiting)
            text = f"{_ranks(behind)} never entered {op} #{newest} that {_ranks(waiting)} {_verb(waiting)} in"
            return HangCause("not-entered", tuple(sorted(behind)), tuple(sorted(waiting)), op, newest, None, text)
    return None


def _gpu_behind(quiet: list[_Rank], wait_in: str) -> HangCause | None:
    """Every host waits, but a rank's GPU never finished work its host gave it long ago (a kernel
    that does not end) at a mark the other ranks' GPUs have passed: the others wait for that rank."""
    marked = {r.rank: r.gpu for r in quiet if r.gpu is not None}  # rank -> (GPU passed, host recorded)
    if len(marked) < 2:
        return None
    furthest = max(passed for passed, _ in marked.values())
    behind = [r for r in quiet if r.rank in marked and marked[r.rank][0] < min(furthest, marked[r.rank][1])]
    if not behind:
        return None
    waiting = [r for r in quiet if r not in behind]
    # the first mark a behind rank's GPU has not passed: its GPU is in the work that leads up to it
    step, mark = gpu_events.describe_position(min(marked[r.rank][0] for r in behind) + 1)
    where = f"GPU work before the {mark} of step {step}"
    whose = "its GPU" if len(behind) == 1 else "their GPUs"
    others = "the GPU of " if len(waiting) == 1 else "the GPUs of "
    text = (
        f"{_ranks(r.rank for r in behind)}: {whose} never finished the work before the {mark} of step {step} "
        "(a kernel that does not end?) "
        f"while {others}{_ranks(r.rank for r in waiting)} got past it; {_ranks(r.rank for r in waiting)} "
        f"{_verb(waiting)} in {wait_in}"
    )
    from openclaw_launch.stats.result import HangCause

    return HangCause(
        "gpu-behind",
        tuple(sorted(r.rank for r in behind)),
        tuple(sorted(r.rank for r in waiting)),
        wait_in,
        None,
        where,
        text,
    )


def _cause(quiet: list[_Rank], startup: bool) -> HangCause:
    found = _not_entered(quiet)
    if found is not None:
        return found
    waiting = [r for r in quiet if r.waits()]
    outside = [r for r in quiet if not r.waits()]
    if waiting and not outside and not startup:
        found = _gpu_behind(quiet, _waited_in(waiting))
        if found is not None:
            return found
    phase = _waited_in(outside) if outside else None
    wait_in = _waited_in(waiting) if waiting else None
    if startup:
        stuck = outside or waiting
        text = f"{_ranks(r.rank for r in stuck)} made no first step (in {_waited_in(stuck)})"
        if outside and waiting:
            text += f" while {_ranks(r.rank for r in waiting)} {_verb(waiting)} in {wait_in}"
        kind = "no-first-step"
    elif outside and waiting:
        stuck = outside
        text = (
            f"{_ranks(r.rank for r in outside)} in {_own(outside)} code (phase {phase}) while "
            f"{_ranks(r.rank for r in waiting)} {_verb(waiting)} in {wait_in}"
        )
        kind = "outside"
    elif waiting:
        stuck = waiting
        text = f"every silent rank waits ({wait_in}): mismatched collectives, or a peer lost elsewhere"
        kind = "all-waiting"
    else:
        stuck = outside
        text = f"{_ranks(r.rank for r in outside)} in {_own(outside)} code (phase {phase}); none waits for a peer"
        kind = "outside"
    from openclaw_launch.stats.result import HangCause

    return HangCause(
        kind,
        tuple(sorted(r.rank for r in stuck)),
        tuple(sorted(r.rank for r in waiting if r not in stuck)),
        wait_in,
        None,
        phase if stuck is outside else wait_in,
        text,
    )


# ---- effects -------------------------------------------------------------------------------------
