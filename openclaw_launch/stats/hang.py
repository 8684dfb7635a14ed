"""Hang detection (``--hang-timeout-s``): name the rank that stopped, show its stack, end the job.

``HangWatch`` is pure (a clock passed in): it turns the statistics channel (step batches and the
progress datagrams of ``wire.Progress``) into per-rank "last step at, in phase X since T", and
judges. A rank is armed after its first step. When an armed rank has had no step for the timeout,
the job hangs; every rank without a step for the timeout is listed, and the *stuck* ones are those
not waiting for peers (not in a collective or ``sync`` phase): the ranks the others wait for. When
every silent rank waits in a collective (a mismatched collective, a dead peer on another node),
all of them are named. A straggler keeps stepping, slowly, and is never a hang.

The effects (signals, py-spy, logs, the console) are in ``stats/hang_monitor.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from openclaw_launch.telemetry import wire

HANG_EXIT_CODE = 124  # as timeout(1): the job was stopped because it made no progress
CHECK_INTERVAL_S = 0.25  # how often the supervisor asks
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
