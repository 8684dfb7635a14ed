"""Zero-code hooks, installed right after the user's script imports torch.

Each hook charges time to a phase of the recorder (see ``wire``): the DataLoader's ``__next__``
(input stage), ``DistributedDataParallel.forward`` and an FSDP2 root's forward, ``Tensor.backward``,
``optimizer.step`` (also the step boundary when the script does not call ``telemetry.step()``), the
step's first module forward (the end of its ``host`` time: a global forward pre-hook armed at each
boundary and removed when it fires, so every other module call keeps torch's hook-free fast path),
the c10d collectives and point-to-point calls called from Python (FSDP2's all-gathers and
reduce-scatters, a pipeline's ``isend``/``irecv``/``batch_isend_irecv``) and ``Work.wait`` after an
asynchronous one: waiting, so a rank's own work is its step minus them. Whether the CPU waits inside
a collective (and inside DDP's backward) follows the backend of the process group the script really
uses (``blocks_host``), not the plan's: with NCCL the CPU only enqueues, so those calls are not
waiting; the host waits for the GPU instead (synchronize, ``.item()``, copies to the host:
``wire.DEVICE_WAIT``, a wait phase) and, with ``--telemetry full``, the wait comes from torch's flight
recorder (``flight_recorder``). On a sample of steps the same hooks time the rank's GPU work with
CUDA events (``gpu_events``). Each wrapper is one frame, which the bootstrap cuts from an uncaught
exception's traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import openclaw_launch.telemetry.flight_recorder as flight_recorder
import openclaw_launch.telemetry.gpu_events as gpu_events
import openclaw_launch.telemetry.groups as groups
import openclaw_launch.telemetry.recorder as recorder
import openclaw_launch.telemetry.wire as wire

_COLLECTIVES = (
    "all_reduce all_reduce_coalesced all_gather all_gather_into_tensor all_gather_single all_gather_coalesced "
    "reduce_scatter reduce_scatter_tensor reduce_scatter_single broadcast barrier monitored_barrier reduce gather "
    "scatter all_to_all all_to_all_single"
).split()
# Point-to-point calls (torch.distributed.pipelining's stage-to-stage traffic): waiting for a peer stage.
_P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def _timed(rec: recorder.Recorder, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    # One frame of ours in a traceback through it (the bootstrap cuts it from an uncaught one).
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        entered = rec.enter(phase)
        try:
            return fn(*args, **kwargs)
        finally:
            if entered:
                rec.leave()

    return wrapper


def blocks_host(backend: str, device_type: str) -> bool:
    """Whether the CPU waits inside a collective of ``backend`` on tensors of ``device_type``: with
    NCCL it only enqueues the work (the GPU waits); gloo, MPI and UCC block the calling thread.
    ``backend`` as ``torch.distributed.get_backend`` gives it: ``gloo``, ``nccl`` or a per-device
    ``cpu:gloo,cuda:nccl``."""
    if ":" in backend:
        per_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
        backend = per_device.get(device_type, per_device.get("cpu", backend))
    return backend.strip().lower() != "nccl"


class _Backends:
    """The backend of each process group the script made, read once per group when first used."""

    def __init__(self, dist: ModuleType) -> None:
        self._dist = dist
        self._seen: dict[int, str] = {}

    def of(self, group: object = None) -> str:
        key = id(group)
        backend = self._seen.get(key)
        if backend is None:
            try:
                backend = str(self._dist.get_backend(group))
            except (RuntimeError, ValueError, AttributeError):  # no such group (yet): assume blocking
                return "gloo"
            self._seen[key] = backend
        return backend


class _Groups:
    """Each process group's key (telemetry/groups.py: its global ranks, its DeviceMesh dimension),
    read once per group when first used; the waits in its calls are booked under it."""

    def __init__(self, dist: ModuleType) -> None:
        self._dist = dist
        self._seen: dict[int, str] = {}
        self._type = getattr(dist, "ProcessGroup", None)

    def of_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key of the group a call names: ``group=``, a positional ProcessGroup, or the first op's
        group of ``batch_isend_irecv``; the default group's when it names none."""
        group = kwargs.get("group")
        if group is None and self._type is not None:
            group = next((a for a in args if isinstance(a, self._type)), None)
            if group is None and args and isinstance(args[0], list) and args[0]:
                group = getattr(args[0][0], "group", None)
        return self.key(group)

    def key(self, group: object) -> str:
        key = self._seen.get(id(group))
        if key is None:
            try:
                pg = group if group is not None else self._dist.group.WORLD
                mesh_dim = groups.mesh_dim_of(str(getattr(pg, "group_desc", "") or ""))
                key = groups.group_key(self._dist.get_process_group_ranks(pg), mesh_dim)
            except (RuntimeError, ValueError, AttributeError, TypeError):  # no such group (yet): not booked
                return ""
            self._seen[id(group)] = key
        return key


def _timed_backward(
    rec: recorder.Recorder, sampler: gpu_events.GpuSampler, fn: Callable[..., Any]
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def backward(*args: Any, **kwargs: Any) -> Any:
        sampler.mark(gpu_events.BACKWARD)
        entered = rec.enter(wire.BACKWARD)
        try:
            return fn(*args, **kwargs)
        finally:
            if entered:
                rec.leave()

    return backward


def _timed_collective(
    rec: recorder.Recorder,
    fn: Callable[..., Any],
    backends: _Backends,
    on_nccl: Callable[[], None],
    phase: str,
    issued: list[str],
    process_groups: _Groups,
) -> Callable[..., Any]:
    """A collective (or point-to-point call) is waiting time when the call blocks: a backend that
    blocks the host (a barrier always does), booked to the call's process group too. ``async_op``
    calls (FSDP2's all-gathers, the pipeline's ``isend``/``irecv``) are timed too: they return at
    once, and their waiting is in ``Work.wait``, booked to the phase and group of the last
    asynchronous call issued (``issued``). Under NCCL only the name is noted (hang reports)."""
    name = getattr(fn, "__name__", "collective")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        group = process_groups.of_call(args, kwargs)
        if kwargs.get("async_op") or phase == wire.P2P:
            issued[:] = [phase, group]
        tensor = args[0] if args else kwargs.get("tensor")
        device = getattr(getattr(tensor, "device", None), "type", "cpu")
        if name != "barrier" and not blocks_host(backends.of(kwargs.get("group")), device):
            on_nccl()
            rec.last_collective = name
            return fn(*args, **kwargs)
        entered = rec.enter(phase, name, group)
        try:
            return fn(*args, **kwargs)
        finally:
            if entered:
                rec.leave()

    return wrapper


def _timed_wait(rec: recorder.Recorder, wait: Callable[..., Any], issued: list[str]) -> Callable[..., Any]:
    """``Work.wait``: the host waiting for an asynchronous collective or point-to-point call. Inside a
    timed call (torch's synchronous collectives wait on their own ``Work``) it is that call's time."""
    waits = (wire.COLLECTIVE, wire.P2P)

    @functools.wraps(wait)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if rec.innermost() in waits:
            return wait(*args, **kwargs)
        entered = rec.enter(issued[0], None, issued[1])
        try:
            return wait(*args, **kwargs)
        finally:
            if entered:
                rec.leave()

    return wrapper


def _host_waits(rec: recorder.Recorder, torch: ModuleType) -> Callable[[], None]:
    """Installs, once, the hooks on the calls where the host waits for the GPU, booked as waiting
    (under NCCL a peer's lateness shows there: the GPU's stream waits in the all-reduce)."""
    done: list[bool] = []

    def install() -> None:
        if done:
            return
        done.append(True)
        rec.sync_phases.add(wire.DEVICE_WAIT)
        targets: list[tuple[object, str]] = [(torch.Tensor, n) for n in ("item", "tolist", "cpu")]
        if torch.cuda.is_available():
            targets += [(owner, "synchronize") for owner in (torch.cuda, torch.cuda.Event, torch.cuda.Stream)]
        compiling = torch.compiler.is_compiling
        for owner, attr in targets:
            fn = getattr(owner, attr, None)
            if callable(fn):
                setattr(owner, attr, _untraced(compiling, fn, _timed(rec, wire.DEVICE_WAIT, fn)))

    return install


def _untraced(compiling: Callable[[], bool], fn: Callable[..., Any], timed: Callable[..., Any]) -> Callable[..., Any]:
    """``timed`` in eager code; while torch.compile traces, the call itself (no graph break of ours)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs) if compiling() else timed(*args, **kwargs)

    return wrapper


def install(torch: ModuleType) -> None:
    rec = recorder.get()
    if rec is None:
        return
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    _BaseDataLoaderIter.__next__ = _timed(rec, wire.INPUT, _BaseDataLoaderIter.__next__)  # type: ignore[method-assign]
    sampler = gpu_events.GpuSampler(torch.cuda, torch.compiler.is_compiling)
    if rec.progress_on:  # hang detection: how far the GPU got, for a kernel that never ends (stats/hang.py)
        sampler.progress = gpu_events.GpuProgress(torch.cuda, torch.compiler.is_compiling)
        rec.gpu_position = sampler.progress.read
    # loss.backward() and torch.autograd.backward (a pipeline stage's backward from its output's
    # gradient): the same phase, whichever a rank calls (the one calls the other: nested, once).
    torch.Tensor.backward = _timed_backward(rec, sampler, torch.Tensor.backward)
    torch.autograd.backward = _timed_backward(rec, sampler, torch.autograd.backward)
    rec.on_step = _first_forward(rec, torch, sampler)
    rec.on_step(1)  # the first step begins at the first module forward too (when nothing came before)

    ddp_forward = DistributedDataParallel.forward
    dist = torch.distributed
    backends = _Backends(dist)
    on_nccl = _host_waits(rec, torch)

    @functools.wraps(ddp_forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        # DDP's gradient all-reduce is waited for inside backward when its group's backend blocks the
        # host (gloo); with NCCL the CPU only enqueues it, so backward is then work, not waiting.
        if blocks_host(backends.of(getattr(self, "process_group", None)), str(getattr(self, "device_type", "cpu"))):
            rec.sync_phases.add(wire.BACKWARD)
        else:
            on_nccl()
        entered = rec.enter(wire.FORWARD)
        try:
            return ddp_forward(self, *args, **kwargs)
        finally:
            if entered:
                rec.leave()

    DistributedDataParallel.forward = forward  # type: ignore[method-assign]

    def before_step(*_: Any) -> None:
        rec.enter(wire.OPTIMIZER)
        sampler.mark(gpu_events.OPTIMIZER)

    def after_step(*_: Any) -> None:
        sampler.mark(gpu_events.OPTIMIZER_END)
        rec.leave()
        rec.step("optimizer")

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)

    if os.environ.get("OPENCLAW_BACKEND") == "nccl" and flight_recorder.flight_recorder_on():
        c10d = torch._C._distributed_c10d
        reader = flight_recorder.FlightRecorder(getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace)
        rec.gpu_sync_reader = flight_recorder.FlightRecorderThread(reader, rec.step_windows).start().take
    if dist.is_available():
        _hook_distributed(rec, dist, backends, on_nccl)
        init = getattr(dist, "init_process_group", None)
        if callable(init):  # waiting for the other ranks to join: a start-up hang's waiting side (stats/hang.py)
            dist.init_process_group = _timed(rec, wire.RENDEZVOUS, init)


def _hook_distributed(
    rec: recorder.Recorder, dist: ModuleType, backends: _Backends, on_nccl: Callable[[], None]
) -> None:
    """The collectives and point-to-point calls, as ``torch.distributed`` and its ``distributed_c10d``
    module both name them (``batch_isend_irecv`` checks ``op.op is isend`` against its own module's
    name), and ``Work.wait``."""
    c10d = getattr(dist, "distributed_c10d", None)
    issued = [wire.COLLECTIVE, ""]  # the kind and group of the last asynchronous call: what a Work.wait waits for
    process_groups = _Groups(dist)
    for phase, names in ((wire.COLLECTIVE, _COLLECTIVES), (wire.P2P, _P2P)):
        for name in names:
            fn = getattr(dist, name, None)
            if not callable(fn):
                continue
            timed = _timed_collective(rec, fn, backends, on_nccl, phase, issued, process_groups)
            setattr(dist, name, timed)
            if c10d is not None and getattr(c10d, name, None) is fn:
                setattr(c10d, name, timed)
    work = getattr(dist, "Work", None)
    wait = getattr(work, "wait", None)
    if work is not None and callable(wait):
        work.wait = _timed_wait(rec, wait, issued)
    rec.sync_phases.add(wire.P2P)
    if "torch.distributed.pipelining.schedules" in sys.modules:
        _note_pipeline(rec, sys.modules["torch.distributed.pipelining.schedules"])
    else:
        from openclaw_launch.telemetry.after_import import AfterImport

        noting = functools.partial(_note_pipeline, rec)
        sys.meta_path.insert(0, AfterImport("torch.distributed.pipelining.schedules", noting))


def _note_pipeline(rec: recorder.Recorder, schedules: ModuleType) -> None:
    """Once the script imports torch.distributed.pipelining: each schedule made notes which stage
    this rank runs, of how many, with how many micro-batches (the verdict's pipeline finding)."""
    for name, stages_of in (
        ("PipelineScheduleSingle", lambda s: [s._stage]),
        ("PipelineScheduleMulti", lambda s: list(s._stages)),
    ):
        cls = getattr(schedules, name, None)
        init = getattr(cls, "__init__", None)
        if cls is None or init is None:
            continue

        def noted(self: Any, *args: Any, _init: Any = init, _stages_of: Any = stages_of, **kwargs: Any) -> None:
            _init(self, *args, **kwargs)
            try:
                stages = _stages_of(self)
                rec.pipeline = (
                    min(int(s.stage_index) for s in stages),
                    int(stages[0].num_stages),
                    int(self._n_microbatches),
                )
            except (AttributeError, TypeError, ValueError, IndexError):  # a pipelining we do not know
                pass

        functools.update_wrapper(noted, init)
        cls.__init__ = noted


def _first_forward(
    rec: recorder.Recorder, torch: ModuleType, sampler: gpu_events.GpuSampler
) -> Callable[[int], list[tuple[int, float]]]:
    """At each step boundary: a global module forward pre-hook that fires once (the step's first
    module call, DDP or not) and removes itself, ending the step's host time (and starting a sampled
    step's GPU work); and the GPU work of sampled steps the GPU has finished."""
    register = torch.nn.modules.module.register_module_forward_pre_hook
    handle: list[Any] = []

    def fired(module: Any, *_: Any) -> None:
        while handle:
            handle.pop().remove()
        sampler.mark(gpu_events.FORWARD)
        rec.work_started()
        _time_fsdp_forward(rec, type(module))

    def arm(step: int) -> list[tuple[int, float]]:
        if not handle:
            handle.append(register(fired))
        return sampler.boundary(step)

    return arm


def _time_fsdp_forward(rec: recorder.Recorder, cls: type) -> None:
    """An FSDP2 root (``fully_shard`` makes a class ``FSDP<Name>`` of its own for it, subclassing
    ``FSDPModule``): its forward, every call (every micro-batch), becomes the ``forward`` phase, as
    DDP's is. Done once per class, from the step's first module call; the class is FSDP's own, so no
    class of the user's is changed."""
    if "forward" in cls.__dict__ or not any(base.__name__ == "FSDPModule" for base in cls.__mro__[1:]):
        return
    cls.forward = _timed(rec, wire.FORWARD, cls.forward)  # type: ignore[attr-defined]
