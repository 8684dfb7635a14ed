"""A rank that said it was done but does not exit (issue 32 item 6): its final batch came (at its
exit, or sent by itself) and its process is still there after ``--hang-timeout-s``: a hang in its
exit (phase ``exit``), with its stack where it has one, and the job ends 124. The pure verdict, and
real launchers with tests/telemetry_workers/exit_hang.py (no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hang import Job

from openclaw_launch.stats.hang import EXIT_PHASE, HANG_EXIT_CODE, HangWatch
from openclaw_launch.telemetry import wire

WORKER = str(Path(__file__).parent / "telemetry_workers" / "exit_hang.py")


def test_a_finished_rank_still_there_after_the_timeout_hangs_in_its_exit_and_one_that_exited_does_not() -> None:
    watch = HangWatch(2.0, [(0, 0, "n"), (1, 1, "n")])
    watch.reset(0.0)
    for rank in (0, 1):
        watch.on_spawn(rank, 100 + rank)
        watch.on_batch(wire.Batch(rank, final=True), 1.0)
    watch.on_exit(0)
    assert watch.in_exit() == [1]
    assert watch.check(2.9) is None  # within the bound
    hang = watch.check(3.1)
    assert hang is not None and [(h.rank, h.phase, h.stuck) for h in hang.ranks] == [(1, EXIT_PHASE, True)]
    assert hang.cause is not None and "never exited" in hang.cause.text and hang.cause.ranks == (1,)
    watch.on_exit(1)
    assert watch.check(10.0) is None and watch.in_exit() == []


@pytest.mark.parametrize("mode", ["c-exit", "final"])
def test_a_rank_that_said_it_was_done_and_does_not_exit_is_a_hang_and_the_job_ends_124(
    tmp_path: Path, mode: str
) -> None:
    job = Job(tmp_path, ["--hang-timeout-s", "2"], ["--mode", mode], worker=WORKER)
    code = job.wait()
    err = "\n".join(line for _, line in job.err)
    assert code == HANG_EXIT_CODE, err
    assert "never exited: stuck in its own exit" in err and "Traceback" not in err
    hang = json.loads(job.report.read_text())["hang"]
    assert [(r["rank"], r["phase"], r["stuck"]) for r in hang["ranks"]] == [(1, "exit", True)]
    if mode == "final":  # Python still runs: faulthandler's stack shows where it waits
        log = (tmp_path / "logs" / "h" / "attempt-0" / "rank-1" / "stderr.log").read_text()
        assert "exit_hang.py" in log and "BLOCKS-HERE" not in log  # the line, not its comment
        assert "stack of rank 1" in err
    assert job.leftovers() == []
