"""The recorder's step accounting (issue 27 items 4 and 6), on a fake clock: N boundaries are N
steps (the first begins at the rank's first phase or module forward), and the loop's own code
between a forward and the next work, or after a backward when the next micro-batch comes, is
``host`` time, not the rank's compute."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.telemetry import recorder, wire, wire_check


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _steps(tmp_path: Path, script: list[tuple[str, object]]) -> list[tuple[float, dict[str, float]]]:
    """Run ``script`` (("enter", name) | ("leave", None) | ("work", None) | ("step", None) |
    ("wait", seconds)) on a real recorder; the steps as the launcher receives them."""
    path = str(tmp_path / "s.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(GUARD_S)
    clock = FakeClock()
    rec = recorder.Recorder(path, rank=0, clock=clock)
    for action, arg in script:
        if action == "enter":
            rec.enter(str(arg))
        elif action == "leave":
            rec.leave()
        elif action == "work":
            rec.work_started()
        elif action == "step":
            rec.step("optimizer")
        else:
            clock.now += float(arg)  # type: ignore[arg-type]
    rec.close()
    steps: list[tuple[float, dict[str, float]]] = []
    while True:  # a batch goes out every half second of the fake clock too; the last is the final one
        batch = wire_check.decode(sock.recv(65536))
        assert batch is not None
        steps += batch.steps
        if batch.final:
            sock.close()
            return steps


def _optimizer_step() -> list[tuple[str, object]]:
    return [("enter", wire.OPTIMIZER), ("wait", 0.001), ("leave", None), ("step", None)]


def test_fifty_optimizer_steps_are_fifty_steps_the_first_from_its_first_forward(tmp_path: Path) -> None:
    body: list[tuple[str, object]] = [("wait", 0.5)]  # imports, init_process_group: before any step
    body += [("enter", wire.RENDEZVOUS), ("wait", 0.2), ("leave", None)]  # not a step's time either
    for _ in range(50):
        body += [("wait", 0.002), ("work", None), ("wait", 0.004)] + _optimizer_step()
    steps = _steps(tmp_path, body)
    assert len(steps) == 50
    assert steps[0][0] == pytest.approx(0.005)  # the first step: from its first module forward
    assert steps[1][0] == pytest.approx(0.007) and steps[1][1] == pytest.approx({"host": 0.002, "optimizer": 0.001})


def test_the_batch_fetched_between_forward_and_backward_is_host(tmp_path: Path) -> None:
    """nanoGPT's loop: forward, then the next batch (``get_batch``), then backward."""
    step: list[tuple[str, object]] = [("enter", wire.FORWARD), ("wait", 0.004), ("leave", None)]
    step += [("wait", 0.003), ("enter", wire.BACKWARD), ("wait", 0.006), ("leave", None)]
    steps = _steps(tmp_path, step + _optimizer_step() + step + _optimizer_step())
    assert steps[1][1] == pytest.approx({"forward": 0.004, "host": 0.003, "backward": 0.006, "optimizer": 0.001})


def test_accumulation_micro_batches_each_fetch_as_host_and_clipping_stays_work(tmp_path: Path) -> None:
    """Four micro-batches: the fetch before micro-batches 2..4 (after a backward, before the next
    forward) is host, through a DataLoader its input part; the gradient clipping between the last
    backward and the optimizer step stays the rank's own work ("other")."""
    micro: list[tuple[str, object]] = [("enter", wire.FORWARD), ("wait", 0.002), ("leave", None)]
    micro += [("enter", wire.BACKWARD), ("wait", 0.003), ("leave", None), ("wait", 0.001)]
    loaded: list[tuple[str, object]] = [("enter", wire.INPUT), ("wait", 0.002), ("leave", None), ("wait", 0.001)]
    step = micro + micro + loaded + micro + micro + _optimizer_step()  # the last micro's 0.001: clipping
    steps = _steps(tmp_path, step + step)
    step_s, phases = steps[1]
    assert step_s == pytest.approx(4 * 0.006 + 0.003 + 0.001)
    assert phases == pytest.approx(
        {"forward": 0.008, "backward": 0.012, "host": 0.002 + 0.002, "input": 0.002, "optimizer": 0.001}
    )
    assert step_s - sum(phases.values()) == pytest.approx(0.001)  # "other": the clipping


def test_a_pipeline_stage_travels_with_the_batch() -> None:
    batch = wire.Batch(rank=2, steps=[(0.1, {wire.P2P: 0.05})], pipeline=(2, 4, 8))
    assert wire_check.decode(wire.encode(batch)) == batch
    bad = wire.encode(batch).replace(b'"pp":[2,4,8]', b'"pp":[5,4,8]')
    assert wire_check.decode(bad) is None


def test_a_pipeline_schedule_made_notes_the_stage_this_rank_runs(tmp_path: Path) -> None:
    """torch.distributed.pipelining's schedules, as the hooks patch them once the script imports
    them (a stand-in module with the same shape: a single-stage and a multi-stage schedule)."""
    import types

    from openclaw_launch.telemetry import torch_hooks

    class Stage:
        def __init__(self, index: int) -> None:
            self.stage_index, self.num_stages = index, 8

    class PipelineScheduleSingle:
        def __init__(self, stage: Stage, n_microbatches: int) -> None:
            self._stage, self._n_microbatches = stage, n_microbatches

    class PipelineScheduleMulti:
        def __init__(self, stages: list[Stage], n_microbatches: int) -> None:
            self._stages, self._n_microbatches = stages, n_microbatches

    schedules = types.ModuleType("schedules")
    schedules.PipelineScheduleSingle = PipelineScheduleSingle  # type: ignore[attr-defined]
    schedules.PipelineScheduleMulti = PipelineScheduleMulti  # type: ignore[attr-defined]
    rec = recorder.Recorder(str(tmp_path / "nobody.sock"), rank=0)
    torch_hooks._note_pipeline(rec, schedules)
    PipelineScheduleSingle(Stage(2), n_microbatches=4)
    assert rec.pipeline == (2, 8, 4)
    PipelineScheduleMulti([Stage(5), Stage(1)], n_microbatches=16)
    assert rec.pipeline == (1, 8, 16)
    rec.close()
