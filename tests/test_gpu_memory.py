"""The GPU memory gate (run/gpu_memory.py) in a real supervision: a fake GPU, replayed from the
recorded H200's samples (NVML is the absent hardware), that keeps its in-run memory after a failed
attempt is named; one that falls back is not; no restart left, no wait."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

from supervise_driver import make_plan

from openclaw_launch.run.gpu_memory import GpuMemoryGate, RecordedMemory
from openclaw_launch.run.supervise import SuperviseOptions, supervise

SAMPLES = Path(__file__).parent / "data" / "nvml-samples-h200x2.json"
GPU = "GPU-7a3b1c9d-ef01-2345-6789-0abcdef12345"


def _recorded_mib() -> tuple[float, float]:
    """The recorded H200's used memory before its run and during it."""
    used = [s["memory_used_mib"] for s in next(iter(json.loads(SAMPLES.read_text())["samples"].values()))]
    return used[0], max(used)


def _gate(readings: list[float], max_restarts: int = 1, timeout_s: float = 0.0) -> tuple[GpuMemoryGate, list[str]]:
    """A failing one-rank job on ``GPU`` whose readings are ``readings`` (the first: before the job);
    the gate and what it said."""
    plan = make_plan(1, ["--exit", "1"])
    plan = replace(plan, ranks=(replace(plan.ranks[0], gpu_uuid=GPU),))
    reader = RecordedMemory({GPU: [{"memory_used_mib": mib} for mib in readings]})
    said: list[str] = []
    gate = GpuMemoryGate([GPU], lambda: reader, timeout_s, max_restarts, said.append, sleep=lambda s: None)
    options = SuperviseOptions(stdout=io.StringIO(), stderr=io.StringIO(), use_guardian=False, max_restarts=0)
    supervise(plan, options, participants=[gate])
    return gate, said


def test_a_gpu_that_keeps_its_in_run_memory_is_named_and_one_that_frees_it_is_not() -> None:
    idle, held = _recorded_mib()
    kept, said = _gate([idle, held])
    assert kept.before == {GPU: idle}
    assert kept.held[0] == (
        f"{GPU}: {held:.0f} MiB used, {idle:.0f} MiB before the job (not back within 0 s, --gpu-memory-timeout-s)"
    )
    assert said == [f"openclaw-launch: GPU memory not freed after attempt 1: {kept.held[0]}"]
    freed, said = _gate([idle, held, idle + 100], timeout_s=60.0)  # freed at the second reading after
    assert freed.held == {} and said == []  # within the slack (a monitor's context)


def test_no_restart_left_or_no_gpu_no_wait() -> None:
    idle, held = _recorded_mib()
    assert _gate([idle, held], max_restarts=0)[0].held == {}
    gate = GpuMemoryGate([], lambda: RecordedMemory({}), 0.0, 1, print)
    gate.begin_attempt(0)
    assert gate.before == {}
