"""Zero-code hooks, installed right after the user's script imports torch.

Each hook charges time to a phase of the recorder (see ``wire``): the DataLoader's ``__next__``
(input stage), ``DistributedDataParallel.forward``, ``Tensor.backward``, ``optimizer.step`` (also
the step boundary when the script does not call ``telemetry.step()``), and blocking collectives
called from Python on CPU backends. With NCCL the CPU does not wait inside these calls, so the
wait comes from torch's flight recorder instead (per-collective GPU durations, read at flush).
"""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable
from types import ModuleType
from typing import Any

from openclaw_launch.telemetry import recorder, wire

_COLLECTIVES = (
    "all_reduce all_gather all_gather_into_tensor reduce_scatter reduce_scatter_tensor broadcast barrier "
    "reduce gather scatter all_to_all all_to_all_single"
).split()


def _timed(rec: recorder.Recorder, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        entered = rec.enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            if entered:
                rec.leave()

    return wrapper


def _timed_blocking(rec: recorder.Recorder, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A collective is waiting time only when the call blocks (``async_op`` false)."""
    timed = _timed(rec, wire.COLLECTIVE, fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if kwargs.get("async_op") else timed(*args, **kwargs)

    return wrapper


def install(torch: ModuleType) -> None:
    rec = recorder.get()
    if rec is None:
        return
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    _BaseDataLoaderIter.__next__ = _timed(rec, wire.INPUT, _BaseDataLoaderIter.__next__)  # type: ignore[method-assign]
    torch.Tensor.backward = _timed(rec, wire.BACKWARD, torch.Tensor.backward)

    ddp_forward = DistributedDataParallel.forward

    @functools.wraps(ddp_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec.sync_phases.add(wire.BACKWARD)  # DDP's gradient all-reduce is waited for inside backward
        entered = rec.enter(wire.FORWARD)
        try:
            return ddp_forward(self, *args, **kwargs)
        finally:
            if entered:
                rec.leave()

    DistributedDataParallel.forward = forward  # type: ignore[method-assign]

    def before_step(*_: Any) -> None:
        rec.enter(wire.OPTIMIZER)

    def after_step(*_: Any) -> None:
        rec.leave()
        rec.step("optimizer")

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)

    backend = os.environ.get("OPENCLAW_BACKEND", "gloo")
    dist = torch.distributed
    if backend == "nccl":
        rec.gpu_sync_reader = _FlightRecorder(torch).read
    elif dist.is_available():
        for name in _COLLECTIVES:
            fn = getattr(dist, name, None)
            if callable(fn):
                setattr(dist, name, _timed_blocking(rec, fn))


class _FlightRecorder:
    """Sum of completed NCCL collective durations since the last read (TORCH_NCCL_ENABLE_TIMING)."""

    def __init__(self, torch: ModuleType) -> None:
        self._dump = torch._C._distributed_c10d._dump_nccl_trace
        self._seen = -1  # highest record_id already counted

    def read(self) -> tuple[float, int] | None:
        data = pickle.loads(self._dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))
        total_ms, count, seen = 0.0, 0, self._seen
        for entry in sorted(data.get("entries", ()), key=lambda e: e.get("record_id", -1)):
            record_id = entry.get("record_id", -1)
            if record_id <= self._seen:
                continue
            duration = entry.get("duration_ms")
            if duration is None:
                if entry.get("state") != "completed":
                    break  # not finished yet: count it (and what follows) next time
                seen = record_id
                continue
            total_ms += float(duration)
            count += 1
            seen = record_id
        self._seen = seen
        return (total_ms / 1000.0, count) if count else None
