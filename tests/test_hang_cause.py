"""Issue 17: a hang names its cause, and every count of it agrees. Real gloo ranks on the CPU."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import invoke

from openclaw_launch.config import defaults
from openclaw_launch.config.reader import parse_config
from openclaw_launch.errors import ConfigError
from openclaw_launch.stats.hang import HANG_EXIT_CODE, HangWatch
from openclaw_launch.telemetry import gpu_events, wire
from tests.test_hang import Job

AT = 20  # rank 2 stops after exactly this many steps (telemetry.step() calls: each ends a step)


def _hang_job(tmp_path: Path, mode: str, extra_env: dict[str, str] | None = None) -> tuple[Job, dict, str]:
    job = Job(
        tmp_path,
        ["--hang-timeout-s", "3"],
        ["--mode", mode, "--rank", "2", "--at", str(AT), "--step-ms", "20", "--steps", "200"],
        nproc=4,
        env=extra_env,
    )
    code = job.wait()
    console = "\n".join(line for _, line in job.err)
    assert code == HANG_EXIT_CODE, console
    report = json.loads(job.report.read_text())
    assert job.leftovers() == []
    return job, report, console


@pytest.mark.parametrize("mode", ["sleep", "pause"])
def test_the_rank_in_its_own_code_is_the_cause_and_every_count_says_its_steps(tmp_path: Path, mode: str) -> None:
    """Rank 2 stops after 20 steps in its own code (a Python loop of sleeps; libc pause() through
    ctypes: a C call, no Python progress); ranks 0, 1, 3 block in the next all-reduce."""
    _, report, console = _hang_job(tmp_path, mode)
    hang = report["hang"]
    cause = hang["cause"]
    assert cause["kind"] == "outside" and cause["ranks"] == [2] and cause["waiting"] == [0, 1, 3]
    assert cause["collective"] == "all_reduce"
    assert "cause: rank 2 in its own code (phase other) while ranks 0, 1, 3 wait in all_reduce" in console
    assert [r["rank"] for r in hang["ranks"] if r["stuck"]] == [2]
    # one count: the hang entry, the console's hang lines, the statistics, the exit table
    entry = {r["rank"]: r["steps"] for r in hang["ranks"]}
    lines = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"rank (\d) \(local rank.*?\(step (\d+)\)", console)}
    stats = {r["rank"]: r["statistics"]["steps"] for r in report["ranks"]}
    table = {
        int(m.group(1)): int(m.group(2)) for m in re.finditer(r"(?m)^ +(\d) \S+ +\S+ +\S+ +\S+ +\S+ +(\d+) ", console)
    }
    for counts in (entry, lines, stats, table):
        assert counts[2] == AT, (entry, lines, stats, table)
        assert all(abs(counts[r] - AT) <= 1 for r in (0, 1, 3)), (entry, lines, stats, table)


def test_with_the_flight_recorder_the_rank_that_never_entered_the_collective_is_named(tmp_path: Path) -> None:
    """torch's flight recorder (on gloo too, with a buffer size): ranks 0, 1, 3 wait in all-reduce
    #21 (the sequence number), rank 2's newest is #20, done: it never entered #21."""
    _, report, console = _hang_job(tmp_path, "sleep", {"TORCH_FR_BUFFER_SIZE": "200"})
    cause = report["hang"]["cause"]
    assert cause["kind"] == "not-entered" and cause["ranks"] == [2] and cause["waiting"] == [0, 1, 3], cause
    assert cause["seq"] == AT + 1 and cause["collective"] == "all_reduce"
    assert f"cause: rank 2 never entered all_reduce #{AT + 1} that ranks 0, 1, 3 wait in" in console


def _progress(rank: int, steps: int, phase: str | None, backend: str | None) -> wire.Progress:
    return wire.Progress(rank, steps, 0.0, phase, 0.0, None, dump_signal=None, backend=backend)


@pytest.mark.parametrize(("backend", "stuck"), [("nccl", [1]), ("gloo", [0, 1])])
def test_with_nccl_a_rank_blocked_in_backward_waits(backend: str, stuck: list[int]) -> None:
    """The GPU symptom: rank 0 blocked in backward (its CPU waits on the stream behind DDP's
    all-reduce), rank 1 in its own code. The backend is the one the rank's group reports."""
    w = HangWatch(2.0, [(0, 0, "n"), (1, 1, "n")])
    w.reset(0.0)
    w.on_progress(_progress(0, 5, wire.BACKWARD, backend), 0.0)
    w.on_progress(_progress(1, 5, None, backend), 0.0)
    verdict = w.check(2.0)
    assert verdict is not None and verdict.cause is not None
    assert [h.rank for h in verdict.stuck] == stuck
    if backend == "nccl":
        assert verdict.cause.text == "rank 1 in its own code (phase other) while rank 0 waits in backward"


@pytest.mark.parametrize("waiting_phase", [wire.BACKWARD, wire.DEVICE_WAIT])
def test_with_nccl_ranks_waiting_on_the_gpu_name_the_rank_outside_as_the_cause(waiting_phase: str) -> None:
    """NCCL: ranks 0 and 2 sit behind the all-reduce on their GPU streams (host side in DDP's backward,
    or in ``.item()``/``synchronize``: ``device-wait``), rank 1 in its own code. Known from the
    backend alone, before any batch listed the rank's wait phases; the same phase alone (every rank
    in it) is everyone waiting, not a cause."""
    w = HangWatch(2.0, [(0, 0, "n"), (1, 1, "n"), (2, 2, "n")])
    w.reset(0.0)
    for rank, phase in ((0, waiting_phase), (1, None), (2, waiting_phase)):
        w.on_progress(_progress(rank, 5, phase, "nccl"), 0.0)
    verdict = w.check(2.0)
    assert verdict is not None and verdict.cause is not None
    cause = verdict.cause
    assert (cause.kind, cause.ranks, cause.waiting, cause.collective) == ("outside", (1,), (0, 2), waiting_phase)
    assert cause.text == f"rank 1 in its own code (phase other) while ranks 0, 2 wait in {waiting_phase}"
    assert [h.rank for h in verdict.stuck] == [1]
    w.on_progress(_progress(1, 5, waiting_phase, "nccl"), 0.0)
    assert w.check(2.0).cause.kind == "all-waiting"  # type: ignore[union-attr]


@pytest.mark.parametrize(("backend", "phase"), [("nccl", wire.DEVICE_WAIT), ("gloo", wire.BACKWARD)])
def test_a_gpu_that_never_passes_a_mark_the_others_passed_is_the_cause(backend: str, phase: str) -> None:
    """A kernel that never ends on rank 1: every host waits (NCCL: ``.item()``; gloo: DDP's backward),
    so by phase nobody is outside; rank 1's GPU stopped before the backward of step 21 (its host
    recorded marks up to the optimizer's end), ranks 0 and 2's GPUs passed it: rank 1 is the cause."""
    w = HangWatch(2.0, [(0, 0, "n"), (1, 1, "n"), (2, 2, "n")])
    w.reset(0.0)
    fwd, bwd, end = (gpu_events.position(21, m) for m in (gpu_events.FORWARD, gpu_events.BACKWARD, "optimizer-end"))
    for rank, gpu in ((0, (bwd, end)), (1, (fwd, end)), (2, (bwd, end))):
        w.on_batch(wire.Batch(rank=rank, sync_phases=(wire.SYNC, wire.COLLECTIVE, wire.BACKWARD)), 0.0)  # gloo's DDP
        w.on_progress(replace(_progress(rank, 20, phase, backend), gpu=gpu), 0.0)
    verdict = w.check(2.0)
    assert verdict is not None and verdict.cause is not None
    cause = verdict.cause
    assert (cause.kind, cause.ranks, cause.waiting) == ("gpu-behind", (1,), (0, 2)), cause
    assert cause.text == (
        "rank 1: its GPU never finished the work before the backward of step 21 (a kernel that does not end?) "
        f"while the GPUs of ranks 0, 2 got past it; ranks 0, 2 wait in {phase}"
    )
    assert [h.rank for h in verdict.stuck] == [1]


def test_a_gpu_behind_without_outstanding_work_or_alone_names_no_gpu_cause() -> None:
    """Rank 1's GPU passed every mark its host recorded (its host is behind, not its GPU: a
    mismatched collective); a rank without marks (no CUDA) is never compared: all-waiting."""
    w = HangWatch(2.0, [(0, 0, "n"), (1, 1, "n"), (2, 2, "n")])
    w.reset(0.0)
    fwd, bwd = gpu_events.position(21, gpu_events.FORWARD), gpu_events.position(21, gpu_events.BACKWARD)
    for rank, gpu in ((0, (bwd, bwd)), (1, (fwd, fwd)), (2, None)):
        w.on_progress(replace(_progress(rank, 20, wire.DEVICE_WAIT, "nccl"), gpu=gpu), 0.0)
    verdict = w.check(2.0)
    assert verdict is not None and verdict.cause is not None and verdict.cause.kind == "all-waiting"


def test_a_rank_that_never_reaches_init_is_a_start_up_hang(tmp_path: Path) -> None:
    """Rank 1 sleeps before init_process_group; rank 0 waits in it (the rendezvous): with a start-up
    allowance of 12 s (rank 0 must have imported torch and reached it by then) the job ends 124
    naming rank 1, with both ranks' stacks."""
    job = Job(
        tmp_path,
        ["--hang-timeout-s", "30", "--startup-timeout-s", "12"],
        ["--rank", "1", "--init-sleep-s", "600", "--steps", "5"],
        nproc=2,
    )
    code = job.wait()
    console = "\n".join(line for _, line in job.err)
    assert code == HANG_EXIT_CODE, console
    hang = json.loads(job.report.read_text())["hang"]
    assert hang["startup"] and hang["cause"]["kind"] == "no-first-step" and hang["cause"]["ranks"] == [1], hang
    assert "no first step within the start-up allowance of 12 s" in console
    assert "cause: rank 1 made no first step (in other) while rank 0 waits in rendezvous" in console
    assert 'hang.py", line' in console and "in main" in console  # the stacks on the console
    assert console.count("openclaw-launch: hang: stack of rank") == 2
    assert job.leftovers() == []


def test_the_start_up_allowance_key_option_and_default() -> None:
    base = "cluster:\n  nodes:\n    - name: a\n      cpu_workers: 1\nruntime:\n  startup_timeout_s: {}\n"
    assert parse_config(base.format("900")).runtime.startup_timeout_s == 900.0
    with pytest.raises(ConfigError, match="startup_timeout_s"):
        parse_config(base.format("1"))
    assert defaults.startup_timeout_s(None, 50.0) is None  # no hang detection: no allowance
    assert defaults.startup_timeout_s(30.0, None) == defaults.STARTUP_TIMEOUT_FLOOR_S
    assert defaults.startup_timeout_s(3600.0, None) == 3600.0
    assert defaults.startup_timeout_s(30.0, 5.0) == 5.0
    for args, needle in (
        (["--startup-timeout-s", "1"], "--startup-timeout-s"),
        (["--startup-timeout-s", "9"], "needs"),
    ):
        done = invoke("--nproc-per-node", "1", *args, "x.py")
        assert done.returncode == 2 and needle in done.stderr and "Traceback" not in done.stderr, done.stderr
        planned = invoke("plan", "--nproc-per-node", "1", *args, "x.py")
        assert planned.returncode == 2 and needle in planned.stderr, planned.stderr  # plan checks it as run
