"""The worker-side recorder: per-step exclusive phase times, batched, sent without ever blocking.

One per process, created on first use from the environment the launcher set. Phases nest: time
belongs to the innermost active phase, so the phases of a step add up to at most the step. The time
from a step boundary to the step's first phase that is not input (``wire.HOST``: batches sliced in
the loop, host-to-device copies, logging) is a phase of its own; the DataLoader's time inside it
stays ``input``. ``on_step`` (the torch hooks) arms a one-shot module forward pre-hook that ends it
and hands over the GPU work of sampled steps (telemetry/gpu_events.py), sent with the batch.
Calls from threads other than the one that created the recorder are ignored (the phase stack is
the main loop's; DataLoader and autograd threads do not call these hooks).

With hang detection on (``wire.PROGRESS_ENV``), a daemon thread wakes every interval and, when the
step count or the innermost phase changed, sends one small progress datagram: the launcher then
knows what a rank blocked inside a phase is doing and since when. ``enter``/``leave`` stay a few
attribute writes; a rank blocked in a phase entered right after a flush is still reported.
The same thread sends the batch of a rank that stopped stepping (its last steps are not lost to a
flush that never comes) and, with torch's flight recorder on, reads once per stall which collective
the rank entered last (``wire.LastCollective``), and says how far the rank's GPU got (``gpu_position``).

A rank stopped by the launcher keeps its steps: SIGTERM flushes the batch (``watch_sigterm``,
telemetry/sigterm_flush.py), then ends the process as SIGTERM would.
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import openclaw_launch.telemetry.wire as wire
from openclaw_launch.telemetry.sigterm_flush import SigtermFlush
from openclaw_launch.telemetry.torch_state import default_group_backend, read_last_collectives

DUMP_SIGNAL: int | None = None  # set by the bootstrap once its faulthandler listens for it
STALL_S = 2.0  # no step this long: the progress thread reads the flight recorder (then every STALL_S)
# Sent at once when entered: the call may hold the GIL while it waits (init_process_group's store),
# and the progress thread would not run to say where the rank is.
ANNOUNCED_PHASES = frozenset({wire.RENDEZVOUS})
# After a backward, the loop's own code is host time when a forward or a fetch comes next (the next
# micro-batch of gradient accumulation); before the optimizer step it stays the rank's work.
_AFTER_BACKWARD_HOST = frozenset({wire.FORWARD, wire.INPUT})


class Recorder:
    def __init__(self, socket_path: str, rank: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self._path = socket_path
        self._token = os.environ.get(wire.TOKEN_ENV, "").encode()  # in front of every datagram
        # A batch goes out at least this often while steps happen (the plan's, from --stats-interval-s)
        self.flush_interval_s = wire.flush_interval_from_env(os.environ.get(wire.FLUSH_ENV))
        self._clock = clock
        self._thread = threading.get_ident()
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self._batch = wire.Batch(rank=rank)
        self._last_step: float | None = None  # the last boundary
        self._origin = clock()
        self._step_start: float | None = None  # when the step in progress began (None: none yet)
        self._gap_since: float | None = None  # a backward left the phase stack empty then
        self._phases: dict[str, float] = {}
        self._stack: list[list[object]] = []  # [name, start, entered] of the active phases, innermost last
        self._boundaries = 0  # step() calls
        self._enters = 0  # enter() calls: a phase entered again is news for the progress thread
        self._idle_since = clock()  # when the phase stack last became empty
        self.last_collective: str | None = None
        self._last_flush = clock()
        self.step_source = "none"
        self.sync_phases: set[str] = {wire.SYNC, wire.COLLECTIVE}
        self._host_since: float | None = None  # the step's before-first-work time is running since
        # Called at each boundary with the number the step now starting will have (arms the forward
        # hook, reads the GPU sampler); what it returns are (step, GPU work seconds) samples to send.
        self.on_step: Callable[[int], list[tuple[int, float]]] | None = None
        # Wall-clock (start, end) of recent steps, for attributing flight-recorder entries to steps.
        self.step_windows: deque[tuple[int, int]] = deque(maxlen=4096)
        self._last_wall_ns: int | None = None
        self.gpu_sync_reader: Callable[[Sequence[tuple[int, int]]], wire.GpuRead | None] | None = None
        # The script's default process group's backend: the torch hooks may set it; else read from
        # torch.distributed (already imported by the script) by the progress thread.
        self.backend: str | None = None
        self.last_collectives: tuple[wire.LastCollective, ...] = ()
        self.pipeline: tuple[int, int, int] | None = None  # set by the torch hooks (wire.Batch.pipeline)
        # How far the rank's GPU got: (passed, recorded) (gpu_events.GpuProgress.read), set by the torch
        # hooks with hang detection on; called by the progress thread.
        self.gpu_position: Callable[[], tuple[int, int] | None] | None = None
        self._flush_lock = threading.Lock()  # the main thread, the progress thread and SIGTERM flush
        self._sigterm = SigtermFlush(self.flush_waiting_at_most)  # armed by watch_sigterm
        self._progress_on = False  # a progress thread runs (hang detection)
        atexit.register(self.close)

    # ---- steps and phases ---------------------------------------------------------------------

    def step(self, source: str) -> None:
        """A step boundary: the end of a step. The first explicit ``telemetry.step()`` wins over the
        optimizer hook. N boundaries are N steps: the first step began at the rank's first phase or
        module forward (``_begin``), or, with neither, when the recorder was made."""
        if threading.get_ident() != self._thread:
            return
        if source == "optimizer" and self.step_source == "api":
            return
        self.step_source = source
        now = self._clock()
        if self._step_start is None:  # a step with no phase at all (the API alone): since we exist
            self._begin(self._origin)
        if self._stack:  # a phase spans the boundary: its time so far belongs to the ending step
            top = self._stack[-1]
            self._charge(top, now)
            top[1] = now
        elif self._host_since is not None:  # no work phase in the whole step: all of it was host
            self._add_host(now)
        self._batch.steps.append((now - float(self._step_start), self._phases))  # type: ignore[arg-type]
        if self.gpu_sync_reader is not None:
            wall_ns = time.time_ns()
            if self._last_wall_ns is not None:
                self.step_windows.append((self._last_wall_ns, wall_ns))
            self._last_wall_ns = wall_ns
        self._phases = {}
        self._last_step = self._step_start = now
        self._host_since = None if self._stack else now  # a phase across the boundary is the step's work
        self._gap_since = None
        self._boundaries += 1
        if self.on_step is not None:  # the step now starting is number boundaries + 1
            self._batch.gpu_busy.extend(self.on_step(self._boundaries + 1))
        if self._boundaries == 1 and self._progress_on:  # arms the launcher's hang watch at once: a rank
            self._send_progress()  # that freezes right after (holding the GIL) sends nothing more
        if now - self._last_flush >= self.flush_interval_s or len(self._batch.steps) >= wire.MAX_BATCH_STEPS:
            self.flush()

    def _begin(self, now: float) -> None:
        """The first step starts (its host time too: the loop's own code until its first work)."""
        self._step_start = self._host_since = now
        if self.gpu_sync_reader is not None:
            self._last_wall_ns = time.time_ns()

    def enter(self, name: str, collective: str | None = None, group: str = "") -> bool:
        """Start phase ``name``; False (and nothing to undo) off the recorder's thread.
        ``collective``: the collective's name, when the phase is one; ``group``: the key of its
        process group (telemetry/groups.py), whose waits the batch also sums."""
        if threading.get_ident() != self._thread:
            return False
        now = self._clock()
        if self._step_start is None and name != wire.RENDEZVOUS:
            self._begin(now)
        if self._stack:
            self._charge(self._stack[-1], now)
        elif self._host_since is not None:
            self._add_host(now)
        elif self._gap_since is not None:  # after a backward: the next micro-batch's fetch is host
            if name in _AFTER_BACKWARD_HOST and now > self._gap_since:
                self._add(wire.HOST, now - self._gap_since)
            if name == wire.INPUT:
                self._host_since = now
        self._gap_since = None
        if name != wire.INPUT:  # the step's first work (or wait): its host time is over
            self._host_since = None
        if collective is not None:
            self.last_collective = collective
        self._enters += 1
        self._stack.append([name, now, now, group])
        if name in ANNOUNCED_PHASES and self._progress_on:
            self._send_progress()
        return True

    def innermost(self) -> str | None:
        """The phase in progress on the recorder's thread (None: none, or another thread)."""
        if not self._stack or threading.get_ident() != self._thread:
            return None
        return str(self._stack[-1][0])

    def leave(self) -> None:
        if not self._stack:
            return
        now = self._clock()
        entry = self._stack.pop()
        name = entry[0]
        self._charge(entry, now)
        if self._stack:
            self._stack[-1][1] = now
        else:
            self._idle_since = now
            # Back from the DataLoader, still before the first work; or after a forward, the loop's own
            # code until the backward is host (nanoGPT fetches the next batch there).
            if self._host_since is not None or name == wire.FORWARD:
                self._host_since = now
            elif name == wire.BACKWARD:  # host if a forward (accumulation) or a fetch comes next
                self._gap_since = now

    def work_started(self) -> None:
        """The step's first module forward (the torch hooks' one-shot pre-hook): host time ends."""
        if self._stack or threading.get_ident() != self._thread:
            return
        now = self._clock()
        if self._step_start is None:
            self._begin(now)
        if self._host_since is None:
            return
        self._add_host(now)
        self._host_since = None

    def _add_host(self, now: float) -> None:
        if self._host_since is not None and now > self._host_since:
            self._add(wire.HOST, now - self._host_since)
        self._host_since = now

    def _add(self, name: str, seconds: float) -> None:
        if self._step_start is not None:  # before the first step began there is no step to charge
            self._phases[name] = self._phases.get(name, 0.0) + seconds

    def _charge(self, entry: list[object], now: float) -> None:
        """A stack entry's time since it last started counting, to its phase and its process group."""
        seconds = now - float(entry[1])  # type: ignore[arg-type]
        self._add(str(entry[0]), seconds)
        if entry[3] and self._step_start is not None:
            waits = self._batch.group_waits
            waits[str(entry[3])] = waits.get(str(entry[3]), 0.0) + seconds

    # ---- progress (hang detection) ------------------------------------------------------------

    def progress(self) -> wire.Progress:
        """What this rank is doing now; safe to call from any thread (reads, never writes)."""
        now = self._clock()
        last = self._last_step
        phase, entered = None, max(self._idle_since, last if last is not None else self._idle_since)
        try:
            top = self._stack[-1]
            phase, entered = str(top[0]), float(top[2])  # type: ignore[arg-type]
        except IndexError:  # no phase (or the main thread just left it)
            pass
        return wire.Progress(
            rank=self._batch.rank,
            steps=self._boundaries,
            step_age_s=None if last is None else now - last,
            phase=phase,
            phase_age_s=now - entered,
            collective=self.last_collective,
            dump_signal=DUMP_SIGNAL,
            backend=self.backend or default_group_backend(),
            last_collectives=self.last_collectives,
            gpu=self.gpu_position() if self.gpu_position is not None else None,
        )

    @property
    def progress_on(self) -> bool:
        """A progress thread reports this rank's state (hang detection is on)."""
        return self._progress_on

    def start_progress(self, interval_s: float | None) -> None:
        """The progress thread (``interval_s``: how often it looks; None: it only waits for
        SIGTERM, when ``watch_sigterm`` armed it)."""
        self._progress_on = interval_s is not None
        threading.Thread(target=self._progress_loop, args=(interval_s,), name="openclaw-progress", daemon=True).start()

    def _send_progress(self) -> None:
        sock = self._sock
        try:
            if sock is not None:
                sock.sendto(self._token + wire.encode_progress(self.progress()), self._path)
        except OSError:  # the launcher is busy or gone: the progress thread tries again
            pass

    def forked(self) -> None:
        """In a forked child: silent. Only the rank's own process speaks for the rank (the launcher
        drops the rest, stats/inbox.py): a child's steps or its exit are not the rank's."""
        self._thread, self._sock, self._progress_on = -1, None, False

    def _progress_loop(self, interval_s: float | None) -> None:
        sent: tuple[object, ...] | None = None
        probed = 0.0
        while self._sock is not None:
            if self._sigterm.wakeup is not None:
                ready, _, _ = select.select([self._sigterm.wakeup], [], [], interval_s)
                if ready:
                    self._sigterm.woken()
                if interval_s is None:
                    continue
            else:
                time.sleep(interval_s or 1.0)
            try:
                now = self._clock()
                last = self._last_step
                if last is not None and now - last >= self.flush_interval_s and self._batch.steps:
                    self.flush()  # the rank stopped stepping: its last steps go out now
                if last is not None and now - last >= STALL_S and now - probed >= STALL_S:
                    probed = now
                    self.last_collectives = read_last_collectives() or self.last_collectives
                p = self.progress()
                key = (
                    p.steps,
                    p.phase,
                    p.collective,
                    self._enters,
                    len(self._stack),
                    p.backend,
                    p.last_collectives,
                    p.gpu,
                )
                if key != sent:
                    sock = self._sock
                    if sock is None:
                        return
                    sock.sendto(self._token + wire.encode_progress(p), self._path)
                    sent = key
            except (BlockingIOError, InterruptedError):
                continue  # the launcher is busy: the next change (or this one, again) goes later
            except Exception:  # the launcher is gone, or we are exiting: never hurt the job
                return

    # ---- sending ------------------------------------------------------------------------------

    def flush(self, final: bool = False) -> None:
        with self._flush_lock:
            self._flush(final)

    def flush_waiting_at_most(self, wait_s: float) -> None:
        """SIGTERM's flush (telemetry/sigterm_flush.py): skipped when the lock is not free within
        ``wait_s`` (its handler may have interrupted this very thread inside ``flush``)."""
        if self._flush_lock.acquire(timeout=wait_s):
            try:
                self._flush(False)
            finally:
                self._flush_lock.release()

    def _flush(self, final: bool) -> None:
        batch = self._batch
        self._last_flush = self._clock()
        if self._sock is None:
            return
        if self.gpu_sync_reader is not None:
            try:
                read = self.gpu_sync_reader(self.step_windows)
            except Exception:  # the flight recorder is torch-internal: never let it hurt the job
                read, self.gpu_sync_reader = None, None
            if read is not None:
                batch.gpu_steps, batch.gpu_sync_s, batch.gpu_late_s = read.steps, read.sync_s, read.late_s
                batch.gpu_collectives = read.collectives
        if not batch.steps and not final and not batch.gpu_steps and not batch.gpu_busy:
            return
        batch.step_source = self.step_source
        batch.pipeline = self.pipeline
        batch.sync_phases = tuple(sorted(self.sync_phases))
        batch.final = final
        self._batch = wire.Batch(rank=batch.rank)
        try:
            self._sock.sendto(self._token + wire.encode(batch), self._path)
        except (BlockingIOError, InterruptedError, OSError) as exc:
            if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
                sock, self._sock = self._sock, None  # the launcher is gone: stop trying
                sock.close()
                return
            self._batch.dropped_batches = batch.dropped_batches + 1

    def watch_sigterm(self) -> None:
        """From the main thread: SIGTERM flushes the batch first (telemetry/sigterm_flush.py)."""
        self._sigterm.arm()

    def close(self) -> None:
        """Send what is left (at exit); later calls do nothing."""
        if self._sock is None:
            return
        try:
            self.flush(final=True)
        finally:
            sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()


_recorder: Recorder | None = None
_resolved = False


def get(watch_sigterm: bool = False) -> Recorder | None:
    """This process's recorder, or None when the launcher asked for no telemetry (or is absent).
    ``watch_sigterm`` (the bootstrap, on the main thread, first): a SIGTERM flushes the batch."""
    global _recorder, _resolved
    if not _resolved:
        _resolved = True
        path = os.environ.get(wire.SOCKET_ENV)
        if path:
            try:
                rank = int(os.environ.get("RANK", "0"))
                local_rank = int(os.environ.get(wire.SLOT_ENV) or os.environ.get("LOCAL_RANK", str(rank)))
                _recorder = Recorder(wire.rank_address(path, local_rank), rank)
                os.register_at_fork(after_in_child=_recorder.forked)
                if watch_sigterm:
                    _recorder.watch_sigterm()
                interval = float(os.environ.get(wire.PROGRESS_ENV) or 0)
                if interval > 0 or _recorder._sigterm.wakeup is not None:
                    _recorder.start_progress(min(max(interval, 0.05), 60.0) if interval > 0 else None)
            except (OSError, ValueError):
                _recorder = None
    return _recorder
