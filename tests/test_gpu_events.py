"""GPU work timed with CUDA events on sampled steps (telemetry/gpu_events.py) and the verdict it
feeds. CUDA is physically absent here: the sampler is driven through a test double of torch.cuda
(events that complete when a fake GPU clock passes them); on a real CPU rank it must stay inert."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from guards import GUARD_S

from openclaw_launch.report.build import straggler_entry
from openclaw_launch.report.format import format_verdict
from openclaw_launch.stats.collect import GPU_BUSY, Collector, RankSummary
from openclaw_launch.stats.verdict import find_stragglers
from openclaw_launch.telemetry import gpu_events, wire, wire_check
from openclaw_launch.telemetry.gpu_events import SAMPLE_EVERY_STEPS, GpuSampler


class FakeGpu:
    """A GPU that is ``lag_ms`` behind the host: an event recorded at host time t completes at
    t + lag on the GPU clock; ``now_ms`` is the host's time."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.lag_ms = 0.0
        self.initialized = True
        self.capturing = False
        self.created = 0

    def is_initialized(self) -> bool:
        return self.initialized

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 (torch.cuda's name)
        self.created += 1
        return FakeEvent(self, enable_timing)


class FakeEvent:
    def __init__(self, gpu: FakeGpu, timed: bool) -> None:
        self.gpu = gpu
        self.timed = timed
        self.at_ms: float | None = None

    def record(self) -> None:
        self.at_ms = self.gpu.now_ms + self.gpu.lag_ms

    def query(self) -> bool:
        return self.at_ms is not None and self.at_ms <= self.gpu.now_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.timed and end.timed, "elapsed_time of an untimed event"
        assert self.query() and end.query(), "elapsed_time of an event the GPU has not reached"
        return float(end.at_ms) - float(self.at_ms)  # type: ignore[arg-type]

    def synchronize(self) -> None:
        raise AssertionError("the sampler must never block on the GPU")


def _run_step(sampler: GpuSampler, gpu: FakeGpu, forward_ms: float, optimizer_ms: float) -> None:
    sampler.mark(gpu_events.FORWARD)
    gpu.now_ms += forward_ms
    sampler.mark(gpu_events.BACKWARD)
    gpu.now_ms += 20.0  # backward: not counted (it holds the gradient all-reduce's wait)
    sampler.mark(gpu_events.OPTIMIZER)
    gpu.now_ms += optimizer_ms
    sampler.mark(gpu_events.OPTIMIZER_END)


def test_sampled_steps_give_forward_plus_optimizer_gpu_time_read_back_later_without_blocking() -> None:
    gpu, got = FakeGpu(), []
    gpu.lag_ms = 30.0  # the GPU runs more than a step behind the host
    sampler = GpuSampler(gpu)
    for step in range(1, 4 * SAMPLE_EVERY_STEPS + 1):
        got += sampler.boundary(step)
        _run_step(sampler, gpu, forward_ms=10.0, optimizer_ms=2.0)
        gpu.now_ms += 3.0  # the loop's own code
    got += sampler.boundary(4 * SAMPLE_EVERY_STEPS + 1)
    sampled = [s for s in range(1, 4 * SAMPLE_EVERY_STEPS + 1) if s % SAMPLE_EVERY_STEPS == 0]
    # every sample but the last came back (the last one's events are still ahead of the GPU)
    assert [s for s, _ in got] == sampled[:-1]
    assert all(seconds == pytest.approx(0.012) for _, seconds in got)
    gpu.now_ms += 100.0  # the GPU catches up: the next boundary reads the last one
    assert sampler.boundary(4 * SAMPLE_EVERY_STEPS + 2) == [(sampled[-1], pytest.approx(0.012))]
    assert gpu.created <= 2 * len(gpu_events.SPANS) * 2  # events are recorded again, not made anew


def test_with_accumulation_the_span_runs_to_the_last_micro_batchs_backward() -> None:
    """Four micro-batches (the first three under DDP's no_sync): every forward (10 ms) and the first
    three backwards (20 ms) are the rank's own GPU work; the last backward (the all-reduce) is not."""
    gpu = FakeGpu()
    sampler = GpuSampler(gpu)
    sampler.boundary(SAMPLE_EVERY_STEPS)
    sampler.mark(gpu_events.FORWARD)  # the step's first module forward
    for micro in range(4):
        gpu.now_ms += 10.0
        sampler.mark(gpu_events.BACKWARD)
        gpu.now_ms += 20.0 if micro < 3 else 25.0
    sampler.mark(gpu_events.OPTIMIZER)
    gpu.now_ms += 2.0
    sampler.mark(gpu_events.OPTIMIZER_END)
    gpu.now_ms += 1.0
    assert sampler.boundary(SAMPLE_EVERY_STEPS + 1) == [(SAMPLE_EVERY_STEPS, pytest.approx(0.100 + 0.002))]


def test_only_every_nth_step_is_timed_and_a_step_without_forward_or_optimizer_gives_nothing() -> None:
    gpu = FakeGpu()
    sampler = GpuSampler(gpu)
    for step in range(1, SAMPLE_EVERY_STEPS):
        assert sampler.boundary(step) == []
        _run_step(sampler, gpu, 5.0, 1.0)
    assert gpu.created == 0  # no event on an unsampled step
    sampler.boundary(SAMPLE_EVERY_STEPS)
    sampler.mark(gpu_events.BACKWARD)  # a step with a backward only: no span is complete
    gpu.now_ms += 50.0
    assert sampler.boundary(SAMPLE_EVERY_STEPS + 1) == [] and sampler.boundary(SAMPLE_EVERY_STEPS + 2) == []


def test_no_cuda_no_capture_no_compile_nothing_recorded_and_errors_disable_it() -> None:
    gpu = FakeGpu()
    gpu.initialized = False  # a CPU rank: the script never initialised CUDA
    sampler = GpuSampler(gpu)
    for step in range(1, 3 * SAMPLE_EVERY_STEPS):
        sampler.boundary(step)
        _run_step(sampler, gpu, 5.0, 1.0)
    assert gpu.created == 0
    gpu.initialized, gpu.capturing = True, True  # a CUDA graph being captured
    sampler.boundary(SAMPLE_EVERY_STEPS * 3)
    _run_step(sampler, gpu, 5.0, 1.0)
    assert gpu.created == 0 and sampler.boundary(SAMPLE_EVERY_STEPS * 3 + 1) == []
    compiling = GpuSampler(FakeGpu(), compiling=lambda: True)
    compiling.boundary(SAMPLE_EVERY_STEPS)
    compiling.mark(gpu_events.FORWARD)
    assert compiling.boundary(SAMPLE_EVERY_STEPS + 1) == []

    class Broken(FakeGpu):
        def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    broken = GpuSampler(Broken())
    broken.boundary(SAMPLE_EVERY_STEPS)
    broken.mark(gpu_events.FORWARD)  # never raises into the training loop
    assert not broken.enabled and broken.boundary(2 * SAMPLE_EVERY_STEPS) == []


def test_a_gpu_far_behind_keeps_a_bounded_number_of_samples_pending() -> None:
    gpu = FakeGpu()
    gpu.lag_ms = 1e9  # never catches up
    sampler = GpuSampler(gpu)
    for step in range(1, 50 * SAMPLE_EVERY_STEPS):
        assert sampler.boundary(step) == []
        _run_step(sampler, gpu, 5.0, 1.0)
    assert len(sampler._pending) == gpu_events.MAX_PENDING


def test_gpu_samples_travel_in_the_batch_and_bad_ones_are_refused() -> None:
    batch = wire.Batch(rank=1, steps=[(0.05, {})], gpu_busy=[(5, 0.012), (10, 0.0125)])
    decoded = wire_check.decode(wire.encode(batch))
    assert decoded is not None and decoded.gpu_busy == [(5, 0.012), (10, 0.0125)]
    for bad in (b"[[5, -1.0]]", b"[[5]]", b'[["5", 0.1]]', b'{"5": 0.1}'):
        raw = wire.encode(batch).replace(b"[[5,0.012],[10,0.0125]]", bad)
        assert wire_check.decode(raw) is None, bad


# ---- the verdict ------------------------------------------------------------------------------


def _gloo_on_cuda(
    gpu_ms: dict[int, float], steps: int = 60, input_ms: dict[int, float] | None = None
) -> list[RankSummary]:
    """Ranks whose CPU phases are alike (with gloo on CUDA tensors every rank's host waits in
    DDP's backward until the slowest GPU is done) and whose sampled GPU work is ``gpu_ms``."""
    collector = Collector()
    for rank, ms in gpu_ms.items():
        extra = (input_ms or {}).get(rank, 0.0) / 1000
        phases = {"host": 0.002 + extra, "forward": 0.004, "backward": 0.040 - extra, "optimizer": 0.003}
        samples = [(s, ms / 1000 + 0.0002 * ((s * (rank + 3)) % 5)) for s in range(1, steps + 1) if s % 5 == 0]
        collector.add(
            wire.Batch(rank=rank, steps=[(0.050, dict(phases))] * steps, sync_phases=("backward",), gpu_busy=samples)
        )
    return collector.summaries()


def test_slow_gpu_work_invisible_to_the_cpu_is_named_as_the_ranks_gpu_work() -> None:
    ranks = _gloo_on_cuda({0: 20.0, 1: 28.0})
    assert all(GPU_BUSY in w for r in ranks for _, w in r.windows)
    [s] = find_stragglers(ranks, {})
    assert (s.rank, s.phase, s.section) == (1, "compute", "gpu")
    assert s.excess_s == pytest.approx(0.008, abs=0.001)
    assert "compute (its GPU work" in format_verdict(straggler_entry(s), 0.05)


def test_balanced_gpu_work_names_nobody_and_an_input_straggler_stays_input() -> None:
    assert find_stragglers(_gloo_on_cuda({0: 20.0, 1: 20.0, 2: 20.2}), {}) == []
    [s] = find_stragglers(_gloo_on_cuda({0: 20.0, 1: 20.0}, input_ms={1: 8.0}), {})
    assert (s.rank, s.phase, s.section) == (1, "input", "host")


def test_a_rank_without_gpu_samples_leaves_the_verdict_to_the_cpu_signals() -> None:
    ranks = _gloo_on_cuda({0: 20.0, 1: 28.0})
    collector = Collector()
    phases = {"host": 0.002, "forward": 0.004, "backward": 0.040, "optimizer": 0.003}
    collector.add(wire.Batch(rank=2, steps=[(0.050, phases)] * 60, sync_phases=("backward",)))
    assert find_stragglers([*ranks, *collector.summaries()], {}) == []


# ---- on a real CPU rank: inert ------------------------------------------------------------------

_LOOP = """
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(12):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("cuda initialised:", torch.cuda.is_initialized())
"""


def _run_rank(tmp_path: Path, code: str, progress_s: float | None = None) -> list[Any]:
    """Runs ``code`` as rank 0's script under the bootstrap (the zero-code hooks) and returns the
    batches it sent (with ``progress_s``: hang detection on, and its progress datagrams too)."""
    script = tmp_path / "loop.py"
    script.write_text(code)
    path = str(tmp_path / "t.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(wire.rank_address(path, 0))
    try:
        env = {**os.environ, wire.SOCKET_ENV: path, "RANK": "0", "PYTHONPATH": str(Path(__file__).parent.parent)}
        env.pop(wire.PROGRESS_ENV, None)
        if progress_s is not None:
            env[wire.PROGRESS_ENV] = str(progress_s)
        proc = subprocess.Popen(
            [sys.executable, "-m", "openclaw_launch.telemetry.bootstrap", str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        batches: list[Any] = []
        sock.settimeout(0.1)
        quiet_since: float | None = None
        while quiet_since is None or time.monotonic() - quiet_since < 0.5:  # read as the launcher does
            try:
                item = wire_check.decode_any(sock.recv(65536))
            except TimeoutError:
                if quiet_since is None and proc.poll() is not None:
                    quiet_since = time.monotonic()
                continue
            assert item is not None
            batches.append(item)
        out, err = proc.communicate(timeout=GUARD_S)
        assert proc.returncode == 0, err
        print(out)
    finally:
        sock.close()
    return batches


def test_a_cpu_rank_sends_no_gpu_samples_and_never_initialises_cuda(tmp_path: Path, capsys: Any) -> None:
    batches = _run_rank(tmp_path, _LOOP)
    assert "cuda initialised: False" in capsys.readouterr().out
    assert sum(len(b.steps) for b in batches) == 12  # the hooks ran: 12 optimizer steps, 12 steps
    assert all(b.gpu_busy == [] for b in batches)


_FAKE_CUDA_LOOP = """
import time
import torch

class HostEvent:  # torch.cuda.Event's test double: the host's clock (CUDA is absent here)
    def __init__(self, enable_timing=False):
        self.at = None
    def record(self):
        self.at = time.perf_counter()
    def query(self):
        return self.at is not None
    def elapsed_time(self, end):
        return 1000 * (end.at - self.at)

torch.cuda.Event = HostEvent
torch.cuda.is_initialized = lambda: True
torch.cuda.is_current_stream_capturing = lambda: False

class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
    def forward(self, x):
        time.sleep(0.02)
        return self.lin(x)

model = Slow()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(22):  # iteration i > 0 is step number i (the first optimizer.step() starts step 1)
    x = torch.randn(4, 8)
    loss = model(x).sum()
    time.sleep(0.03)  # between the forward and the backward: part of the timed span
    opt.zero_grad()
    loss.backward()
    time.sleep(0.15 if i % 5 == 0 else 0.0)  # between backward and optimizer.step(): not timed
    opt.step()
"""


def test_the_hooks_time_forward_to_backward_and_the_optimizer_step_of_every_fifth_step(tmp_path: Path) -> None:
    """The real hooks in a real rank, torch.cuda's clock replaced by the host's: samples for steps
    5, 10, 15, 20, each the forward-to-backward span (20 + 30 ms of sleeps) plus the optimizer step,
    without the 150 ms between the backward and the optimizer step."""
    batches = _run_rank(tmp_path, _FAKE_CUDA_LOOP)
    assert all(isinstance(b, wire.Batch) for b in batches)
    samples = [sample for b in batches for sample in b.gpu_busy]
    assert [step for step, _ in samples] == [5, 10, 15, 20]
    assert all(0.05 <= seconds < 0.15 for _, seconds in samples), samples


def test_with_hang_detection_the_progress_datagrams_say_how_far_the_gpu_got(tmp_path: Path) -> None:
    """The real hooks and progress thread, torch.cuda's events replaced by ones that the "GPU" stops
    passing after iteration 20's forward (a kernel that does not end there): the rank's last progress
    datagram says its GPU passed step 21's forward (steps count from 1: iteration 20 is step 21) and
    no later mark, while its host recorded marks up to step 22's optimizer end."""
    stuck_loop = _FAKE_CUDA_LOOP.replace(
        "    def query(self):\n        return self.at is not None",
        "    def query(self):\n        return self.at is not None and self.at <= STUCK_AT[0]",
    ).replace("torch.cuda.Event = HostEvent", "STUCK_AT = [float('inf')]\ntorch.cuda.Event = HostEvent")
    stuck_loop = stuck_loop.replace(
        "    loss = model(x).sum()\n", "    loss = model(x).sum()\n    if i == 20: STUCK_AT[0] = time.perf_counter()\n"
    )
    stuck_loop += "time.sleep(1.0)  # the progress thread reports\n"
    items = _run_rank(tmp_path, stuck_loop, progress_s=0.1)
    progress = [p for p in items if isinstance(p, wire.Progress) and p.gpu is not None]
    assert progress, items
    passed, recorded = progress[-1].gpu  # type: ignore[misc]
    assert gpu_events.describe_position(passed) == (21, gpu_events.FORWARD)
    assert gpu_events.describe_position(recorded) == (22, gpu_events.OPTIMIZER_END)


def test_gpu_progress_says_which_mark_the_gpu_passed_last_with_a_ring_of_untimed_events() -> None:
    """Hang detection's marks: every mark of every step, untimed, in a ring of PROGRESS_EVENTS that is
    recorded again in turn (no new event per mark); ``read`` gives (passed, recorded) positions, and
    a GPU behind the whole ring reads as one before the oldest it holds."""
    gpu = FakeGpu()
    sampler = GpuSampler(gpu)
    sampler.progress = progress = gpu_events.GpuProgress(gpu)
    assert progress.read() is None
    for step in range(1, 4):
        sampler.boundary(step)
        _run_step(sampler, gpu, 5.0, 1.0)
    end = gpu_events.position(3, gpu_events.OPTIMIZER_END)
    assert progress.read() == (end, end)  # the GPU keeps up with the host
    assert gpu.created <= gpu_events.PROGRESS_EVENTS + 4  # the ring's events, plus one sampled step's
    gpu.lag_ms = 1e9  # from now on the GPU never gets there: a kernel that does not end
    sampler.boundary(4)
    sampler.mark(gpu_events.FORWARD)
    sampler.mark(gpu_events.FORWARD)  # the first call per step counts
    assert progress.read() == (end, gpu_events.position(4, gpu_events.FORWARD))
    for step in range(4, 7):
        sampler.boundary(step)
        _run_step(sampler, gpu, 5.0, 1.0)
    passed, recorded = progress.read()  # type: ignore[misc]
    assert recorded == gpu_events.position(6, gpu_events.OPTIMIZER_END)
    assert passed == recorded - gpu_events.PROGRESS_EVENTS  # before the oldest mark the ring holds
    assert gpu_events.describe_position(passed + 1) == (5, gpu_events.FORWARD)


def test_gpu_progress_records_nothing_while_a_graph_is_captured_or_before_cuda() -> None:
    gpu = FakeGpu()
    progress = gpu_events.GpuProgress(gpu)
    gpu.initialized = False
    progress.mark(gpu_events.FORWARD)
    gpu.initialized, gpu.capturing = True, True
    progress.boundary(1)
    progress.mark(gpu_events.FORWARD)
    assert progress.read() is None and gpu.created == 0
