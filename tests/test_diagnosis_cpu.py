"""The straggler's phase on real loops (issue 17), on CPU with real gloo ranks and no openclaw code in
the script: in-loop batches are the input/host phase, the backend comes from the real group, and
the table, the plot and the verdict count phases the same way."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.report.build import load_report
from openclaw_launch.report.format import format_report, step_split
from openclaw_launch.stats.phases import INPUT, WAIT, WORK, kind, split
from openclaw_launch.telemetry import recorder, torch_hooks, wire, wire_check

ROOT = Path(__file__).resolve().parent.parent
LOOP = str(ROOT / "tests" / "telemetry_workers" / "nanogpt_loop.py")
RECORDED = ROOT / "tests" / "data" / "reports" / "train-2cpu-gloo.json"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _one_step(tmp_path: Path, body: list[tuple[str, object]]) -> dict[str, float]:
    """Run ``body`` (("enter", name) | ("leave", None) | ("work", None) | ("wait", seconds)) between two
    step boundaries of a real recorder; the step's phases as the launcher receives them."""
    path = str(tmp_path / f"t{len(list(tmp_path.iterdir()))}.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(GUARD_S)
    clock = FakeClock()
    rec = recorder.Recorder(path, rank=0, clock=clock)
    rec.step("optimizer")
    for action, arg in body:
        if action == "enter":
            rec.enter(str(arg))
        elif action == "leave":
            rec.leave()
        elif action == "work":
            rec.work_started()
        else:
            clock.now += float(arg)  # type: ignore[arg-type]
    rec.step("optimizer")
    rec.close()
    batch = wire_check.decode(sock.recv(65536))
    sock.close()
    assert batch is not None
    [_, (_, phases)] = batch.steps  # the first boundary ends a step of its own (since the recorder was made)
    return phases


def test_time_before_the_first_forward_is_host_with_the_dataloader_inside_it(tmp_path: Path) -> None:
    phases = _one_step(
        tmp_path,
        [
            ("wait", 0.002),  # zero_grad, logging
            ("enter", wire.INPUT),  # the DataLoader
            ("wait", 0.005),
            ("leave", None),
            ("wait", 0.003),  # host-to-device copy
            ("work", None),  # the first module forward
            ("wait", 0.004),  # forward (not DDP: unhooked)
            ("enter", wire.BACKWARD),
            ("wait", 0.006),
            ("leave", None),
            ("wait", 0.001),
        ],
    )
    assert phases == pytest.approx({"host": 0.005, "input": 0.005, "backward": 0.006})


def test_a_step_with_no_work_phase_is_all_host_and_a_section_ends_it(tmp_path: Path) -> None:
    assert _one_step(tmp_path, [("wait", 0.004)]) == pytest.approx({"host": 0.004})
    phases = _one_step(tmp_path, [("wait", 0.001), ("enter", "compute"), ("wait", 0.002), ("leave", None)])
    assert phases == pytest.approx({"host": 0.001, "compute": 0.002})


def test_the_host_waits_in_a_collective_only_on_backends_that_block_it() -> None:
    assert torch_hooks.blocks_host("gloo", "cpu") and torch_hooks.blocks_host("gloo", "cuda")
    assert not torch_hooks.blocks_host("nccl", "cuda")
    assert not torch_hooks.blocks_host("cpu:gloo,cuda:nccl", "cuda")
    assert torch_hooks.blocks_host("cpu:gloo,cuda:nccl", "cpu")
    assert torch_hooks.blocks_host("mpi", "cpu")


def test_under_nccl_the_host_waiting_for_the_gpu_is_a_wait_phase(tmp_path: Path) -> None:
    """The hooks installed when a group turns out to be NCCL, exercised on CPU tensors: ``.item()``,
    ``.tolist()`` and ``.cpu()`` are booked as ``device-wait``, a wait phase. Restored afterwards."""
    import torch

    saved = {name: getattr(torch.Tensor, name) for name in ("item", "tolist", "cpu")}
    path = str(tmp_path / "nccl.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(GUARD_S)
    try:
        rec = recorder.Recorder(path, rank=0)
        torch_hooks._host_waits(rec, torch)()
        rec.step("optimizer")
        rec.work_started()
        assert torch.ones(3).sum().item() == 3.0 and torch.ones(2).tolist() == [1.0, 1.0]
        rec.step("optimizer")
        rec.close()
        batch = wire_check.decode(sock.recv(65536))
        assert batch is not None and wire.DEVICE_WAIT in batch.sync_phases
        [_, (_, phases)] = batch.steps
        assert phases[wire.DEVICE_WAIT] > 0
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
        sock.close()


def test_one_classification_of_phases() -> None:
    sync = ("backward", "collective", "device-wait")
    assert [kind(p, sync) for p in ("input", "host", "forward", "other", "backward", "device-wait")] == [
        INPUT,
        INPUT,
        WORK,
        WORK,
        WAIT,
        WAIT,
    ]
    cut = split(0.1, {"input": 0.01, "host": 0.02, "forward": 0.03, "backward": 0.04}, waited_s=0.015)
    assert (cut.input_s, cut.wait_s) == pytest.approx((0.03, 0.015)) and cut.work_s == pytest.approx(0.055)


def run(tmp_path: Path, *args: str, launcher: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg,unused-ignore]
    report = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "4", "--report", str(report), *launcher]
        + ["--console-ranks", "none", LOOP, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(report.read_text())


@pytest.mark.parametrize(("loader", "section"), [(False, "host"), (True, "input")])
def test_a_slow_batch_in_the_loop_is_the_input_host_phase(tmp_path: Path, loader: bool, section: str) -> None:
    """Four gloo ranks of a nanoGPT-style loop, rank 1's batch 8 ms slower: sliced from a tensor in
    the loop (no DataLoader) it is the host part of the input/host stage; through a DataLoader, its
    input part. Never "compute"."""
    proc, report = run(tmp_path, "--slow-rank", "1", "--slow-ms", "8", *(["--loader"] if loader else []))
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"], s["section"]) == (1, "input", section)
    assert s["excess_s"] == pytest.approx(0.008, abs=0.002)
    assert "straggler: rank 1 on node localhost: its input/host stage" in proc.stderr
    if not loader:
        assert "input" not in report["ranks"][1]["statistics"]["sections"]  # no DataLoader, no input part


def test_the_backend_of_the_real_group_decides_what_waits(tmp_path: Path) -> None:
    """A gloo group made by a script on a host whose plan says NCCL (OPENCLAW_BACKEND=nccl): DDP's
    backward blocks the host, so it is a wait phase, and rank 2's slow forward is named."""
    _, report = run(tmp_path, "--claim-backend", "nccl", "--slow-rank", "2", "--compute-ms", "8")
    assert all(r["statistics"]["sync_sections"] == ["backward"] for r in report["ranks"])
    [s] = report["stragglers"]
    assert (s["rank"], s["phase"], s["section"]) == (2, "compute", "forward")


def test_the_plot_and_the_table_split_the_step_the_same_way() -> None:
    """A recorded report (2 CPU ranks of examples/train.py, DDP on gloo): the plot's bars, by kind,
    are the table's input / work / wait columns."""
    pytest.importorskip("matplotlib")
    from openclaw_launch.report.plot import segments

    report = load_report(RECORDED)
    table = format_report(report).splitlines()
    for r in report.ranks:
        assert r.statistics is not None
        bars = segments(r.statistics)
        step = r.statistics.step_time_s.mean
        by_kind = {k: sum(s.seconds for s in bars if s.kind == k) / step for k in (INPUT, WORK, WAIT)}
        assert sum(by_kind.values()) == pytest.approx(1.0)
        assert by_kind[INPUT] == pytest.approx(step_split(r.statistics).shares()[0])
        row = next(line for line in table if re.match(rf"\s+{r.rank} ", line))
        printed = [int(v) for v in re.findall(r"(\d+)%", row)]
        assert printed == [round(100 * by_kind[k]) for k in (INPUT, WORK, WAIT)]
        assert by_kind[WAIT] < 0.5  # DDP's backward is mostly its own compute: work, not waiting


def test_the_live_line_names_a_slowdown_that_starts_mid_run(tmp_path: Path) -> None:
    """Rank 1's batches 8 ms slower from step 120 of 260 (about 3.5 s in): the live line, every
    second, names it with its phase by the first line whose interval lies after the start."""
    proc, _ = run(
        tmp_path,
        "--steps",
        "260",
        "--slow-rank",
        "1",
        "--slow-ms",
        "8",
        "--slow-from-step",
        "120",
        launcher=("--stats-interval-s", "1"),
    )
    lines = [line for line in proc.stderr.splitlines() if "openclaw-launch: stats:" in line]
    steps = [int(re.search(r"(\d+) steps", line).group(1)) for line in lines]  # type: ignore[union-attr]
    before = [line for line, n in zip(lines, steps, strict=True) if n < 4 * 120]
    assert before and all("straggler: rank" not in line for line in before)
    first_full = next(i for i, n in enumerate(steps) if n >= 4 * 120) + 1  # the first interval all after it
    assert "straggler: rank 1 (input, host)" in lines[first_full], lines
