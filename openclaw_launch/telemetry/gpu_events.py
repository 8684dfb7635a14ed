"""GPU work timed with CUDA events on a sample of steps, at the default ``hooks`` level.

Why: the CPU cannot see a rank whose GPU work is slow. With NCCL it only enqueues kernels; with
gloo on CUDA tensors it waits inside DDP's backward as long on the fast ranks (for the slow one's
gradients) as on the slow one (for its own GPU), so no CPU phase tells them apart. The GPU's own
clock does: on every ``SAMPLE_EVERY_STEPS``-th step (the same step numbers on every rank) an event
is recorded on the current stream at the step's first module forward, at its last ``backward``
call and around ``optimizer.step()``. The forward (to the backward call) and the optimizer step are
work on the rank's own GPU that holds no wait for peers (the last backward holds DDP's gradient
all-reduce), so their sum is the rank's GPU work per sampled step. With gradient accumulation the
span covers every micro-batch: their forwards and the backwards before the last (DDP's ``no_sync``
leaves the all-reduce to the last one).

The events are read back at later step boundaries with ``Event.query()``, never ``synchronize()``:
timing never blocks the training thread. A rank whose script never initialised CUDA records
nothing (``cuda.is_initialized()``); neither does a stream being captured into a CUDA graph, code
``torch.compile`` is tracing, or anything after an error (the job goes on, unmeasured).

With hang detection on, ``GpuProgress`` also records an untimed event at every mark of *every*
step, so the progress thread can say how far the rank's GPU got (``position``): a kernel that never
ends leaves the host of every rank waiting (in ``device-wait`` or DDP's backward), but only the
stuck rank's GPU stays behind the marks the other ranks' GPUs have passed (stats/hang.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

SAMPLE_EVERY_STEPS = 5  # one sampled step per 5-step window of the verdict (stats/collect.WINDOW_STEPS)
MAX_PENDING = 4  # sampled steps whose events the GPU has not reached yet; beyond it the oldest is dropped
FORWARD, BACKWARD, OPTIMIZER, OPTIMIZER_END = "forward", "backward", "optimizer", "optimizer-end"
# The timed spans: (start mark, end mark). Each needs both marks in the sampled step.
SPANS = ((FORWARD, BACKWARD), (OPTIMIZER, OPTIMIZER_END))
# Recorded again at every call in the sampled step: with gradient accumulation the span runs from the
# first micro-batch's forward to the last micro-batch's backward call, every micro-batch's forward and
# the backwards before the last (under DDP's no_sync, no all-reduce in them) included.
RECORDED_AGAIN = frozenset({BACKWARD})
MARKS = (FORWARD, BACKWARD, OPTIMIZER, OPTIMIZER_END)  # a step's marks in the order the GPU passes them
PROGRESS_EVENTS = 8  # GpuProgress's ring: two steps of marks; a GPU further behind reads as "before the oldest"


def position(step: int, mark: str) -> int:
    """One number for "step ``step``, at ``mark``" that grows as the GPU passes marks."""
    return step * len(MARKS) + MARKS.index(mark)


def describe_position(pos: int) -> tuple[int, str]:
    """The (step, mark) of ``position``'s number."""
    return pos // len(MARKS), MARKS[pos % len(MARKS)]


class GpuSampler:
    """Records and reads back the sampled steps' events. ``cuda``: ``torch.cuda`` (or a test double
    with ``is_initialized``, ``is_current_stream_capturing`` and ``Event(enable_timing=True)``);
    ``compiling``: ``torch.compiler.is_compiling``. Called only from the training thread."""

    def __init__(self, cuda: Any, compiling: Callable[[], bool] = lambda: False) -> None:
        self._cuda = cuda
        self._compiling = compiling
        self._marks: dict[str, Any] | None = None  # the sampled step in progress: mark -> event
        self._step = 0  # its number (as the launcher counts steps)
        self._pending: deque[tuple[int, dict[str, Any]]] = deque()
        self._spare: list[Any] = []  # events of samples already read, recorded again later
        self.enabled = True
        self.progress: GpuProgress | None = None  # set with hang detection on (torch_hooks)

    def boundary(self, step: int) -> list[tuple[int, float]]:
        """At a step boundary: the step now starting is number ``step``. Ends the sampled step in
        progress, returns the (step, GPU seconds) of the samples the GPU has finished, and starts
        sampling when ``step`` is a sampled one."""
        if self.progress is not None:
            self.progress.boundary(step)
        if not self.enabled:
            return []
        try:
            if self._marks is not None:
                self._finish()
            done = self._read()
            if step % SAMPLE_EVERY_STEPS == 0 and self._cuda.is_initialized():
                self._marks, self._step = {}, step
            return done
        except Exception:  # a CUDA error or a torch-internal change: never hurt the job
            self.enabled, self._marks = False, None
            self._pending.clear()
            return []

    def mark(self, name: str) -> None:
        """An event for ``name`` in the sampled step (the first call per name counts; for
        ``BACKWARD`` the last: recorded again), and the progress mark when one is kept."""
        if self.progress is not None:
            self.progress.mark(name)
        marks = self._marks
        if marks is None:
            return
        if name in marks:
            if name in RECORDED_AGAIN:
                try:
                    marks[name].record()
                except Exception:
                    self.enabled, self._marks = False, None
            return
        try:
            if self._compiling() or self._cuda.is_current_stream_capturing():
                self._marks = None  # not this step: a graph must not hold our events
                return
            event = self._spare.pop() if self._spare else self._cuda.Event(enable_timing=True)
            event.record()
            marks[name] = event
        except Exception:
            self.enabled, self._marks = False, None

    def _finish(self) -> None:
        marks, self._marks = self._marks or {}, None
        if not any(start in marks and end in marks for start, end in SPANS):
            return
        self._pending.append((self._step, marks))
        if len(self._pending) > MAX_PENDING:
            self._pending.popleft()  # dropped: its events are left to the garbage collector

    def _read(self) -> list[tuple[int, float]]:
        done: list[tuple[int, float]] = []
        while self._pending and all(event.query() for event in self._pending[0][1].values()):
            step, marks = self._pending.popleft()
            spans = [(marks[a], marks[b]) for a, b in SPANS if a in marks and b in marks]
            done.append((step, sum(start.elapsed_time(end) for start, end in spans) / 1000.0))
            self._spare.extend(list(marks.values())[: 2 * len(SPANS) - len(self._spare)])
        return done


class GpuProgress:
    """How far the rank's GPU got, for the hang watch: an untimed event at every mark of every step
    (a ring of ``PROGRESS_EVENTS``, recorded again in turn), read by the progress thread with
    ``Event.query()`` (never blocking; CUDA's event query is safe from any thread). Costs one event
    record per mark (a few microseconds), which is why it runs only with hang detection on."""

    def __init__(self, cuda: Any, compiling: Callable[[], bool] = lambda: False) -> None:
        self._cuda = cuda
        self._compiling = compiling
        self._step = 0
        self._seen: set[str] = set()  # marks already recorded in this step (the first call counts)
        self._ring: deque[tuple[int, Any]] = deque()  # (position, event), oldest first
        self.enabled = True

    def boundary(self, step: int) -> None:
        self._step, self._seen = step, set()

    def mark(self, name: str) -> None:
        if not self.enabled or name in self._seen:
            return
        self._seen.add(name)
        try:
            if not self._cuda.is_initialized() or self._compiling() or self._cuda.is_current_stream_capturing():
                return
            full = len(self._ring) >= PROGRESS_EVENTS
            event = self._ring.popleft()[1] if full else self._cuda.Event()  # the oldest, recorded again
            event.record()
            self._ring.append((position(self._step, name), event))
        except Exception:  # a CUDA error or a torch-internal change: never hurt the job
            self.enabled = False
            self._ring.clear()

    def read(self) -> tuple[int, int] | None:
        """(The newest position whose event the GPU has passed, the newest one recorded); when the
        GPU passed none of the ring, one before the oldest (it got at most that far). None before
        any mark. From any thread."""
        try:
            ring = list(self._ring)  # one C-level copy under the GIL: the training thread may append
            if not ring:
                return None
            passed = next((pos for pos, event in reversed(ring) if event.query()), ring[0][0] - 1)
            return passed, ring[-1][0]
        except Exception:  # a CUDA error (the context is gone): nothing to say
            return None
