"""The statistics channel is untrusted input (issue 21): real launchers, real workers abusing it
(tests/telemetry_workers/untrusted.py), the job's exit code, its report, and nothing outside it
signalled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_runner import invoke
from guards import GUARD_S

from openclaw_launch.plan.context import MAX_RUN_ID_BYTES, run_context
from openclaw_launch.stats.hang import HANG_EXIT_CODE
from openclaw_launch.telemetry import wire, wire_check

WORKER = str(Path(__file__).parent / "telemetry_workers" / "untrusted.py")
ROOT = str(Path(__file__).parent.parent)


class Job:
    def __init__(
        self, tmp: Path, mode: str, *args: str, launcher: tuple[str, ...] = (), env: dict[str, str] | None = None
    ):
        self.report = tmp / "report.json"
        self.marker = f"untrusted-{os.getpid()}-{tmp.name}"
        argv = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", "--report", str(self.report)]
        argv += ["--grace-period-s", "3", "--stats-interval-s", "0", *launcher, WORKER, "--mode", mode, *args]
        argv += ["--marker", self.marker]
        environ = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
        self.proc = subprocess.run(argv, capture_output=True, text=True, timeout=GUARD_S, env=environ)
        self.code = self.proc.returncode
        self.err = self.proc.stderr

    @property
    def json(self) -> dict[str, Any]:
        return json.loads(self.report.read_text())

    def steps(self) -> dict[int, int]:
        return {r["rank"]: (r["statistics"] or {}).get("steps", 0) for r in self.json["ranks"]}

    def leftovers(self) -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if self.marker in " ".join(p.info["cmdline"] or ())]


def _no_traceback(job: Job) -> None:
    assert "Traceback" not in job.err, job.err
    assert job.leftovers() == []


def test_a_datagram_never_chooses_whom_the_launcher_signals(tmp_path: Path) -> None:
    """Rank 1 names an unrelated process, its group, -1 and pid 1 as its pid, and SIGKILL as its
    dump signal, then hangs: only the job's own workers get the launcher's own dump signal."""
    victim = subprocess.Popen(["sleep", "300"])
    try:
        job = Job(tmp_path, "pids", "--victim", str(victim.pid), launcher=("--hang-timeout-s", "2"))
        assert job.code == HANG_EXIT_CODE, job.err
        assert victim.poll() is None, "the unrelated process was signalled"
        report = job.json
        hang = report["hang"]
        assert hang["stack_source"] == "faulthandler"
        stuck = [r for r in hang["ranks"] if r["stuck"]]
        assert [r["rank"] for r in stuck] == [1]
        worker_pids = {r["rank"]: r["pid"] for r in report["ranks"]}
        assert stuck[0]["pid"] == worker_pids[1]  # the pid it spawned, not one a datagram named
        assert any("untrusted.py" in line and "_hang" in line for line in stuck[0]["stack"]), stuck[0]["stack"]
        assert report["statistics"]["dropped_datagrams"]["1"]["invalid"] == 8
        assert {r["signal"] for r in report["ranks"]} <= {"SIGTERM", None}  # no SIGKILL from a datagram
        _no_traceback(job)
    finally:
        victim.kill()
        victim.wait()


def test_bad_datagrams_are_counted_and_dropped_and_the_job_completes(tmp_path: Path) -> None:
    job = Job(tmp_path, "garbage", launcher=("--hang-timeout-s", "5"))
    assert job.code == 0, job.err
    stats = job.json["statistics"]
    assert stats["dropped_datagrams"]["1"] == {"invalid": 14, "not_rank_process": 0, "over_rate": 0}
    assert stats["dropped_datagrams"]["0"] == {"invalid": 0, "not_rank_process": 1, "over_rate": 0}
    assert stats["bad_datagrams"] == 15
    assert job.steps() == {0: 40, 1: 40}  # neither rank's statistics took the bad ones
    assert "statistics from pid" in job.err and "rank 0" in job.err  # said once, on the console
    _no_traceback(job)


def test_a_forked_child_is_not_the_rank_and_its_hang_is_detected(tmp_path: Path) -> None:
    """A child using the telemetry API exits normally, another sends a raw ``final`` for the rank:
    neither marks rank 1 finished, so its hang right after is detected."""
    job = Job(tmp_path, "fork", launcher=("--hang-timeout-s", "2"))
    assert job.code == HANG_EXIT_CODE, job.err
    report = job.json
    assert [r["rank"] for r in report["hang"]["ranks"] if r["stuck"]] == [1]
    assert report["statistics"]["dropped_datagrams"]["1"]["not_rank_process"] == 1  # the raw one; the API is silent
    _no_traceback(job)


def test_a_freeze_right_after_the_first_step_is_armed_and_detected(tmp_path: Path) -> None:
    """Rank 1 freezes in a C call holding the GIL right after its first step (no progress thread
    runs after it): the first step's own progress datagram armed it."""
    job = Job(tmp_path, "freeze", "--steps", "400", launcher=("--hang-timeout-s", "2"))
    assert job.code == HANG_EXIT_CODE, job.err
    hang = job.json["hang"]
    stuck = [r for r in hang["ranks"] if r["stuck"]]
    assert [r["rank"] for r in stuck] == [1]
    assert any("untrusted.py" in line for line in stuck[0]["stack"]), stuck[0]["stack"]
    _no_traceback(job)


def test_a_flooding_rank_does_not_starve_the_others(tmp_path: Path) -> None:
    job = Job(tmp_path, "flood", "--flood-s", "3", "--steps", "100", launcher=("--hang-timeout-s", "10"))
    assert job.code == 0, job.err
    report = job.json
    rank0 = next(r for r in report["ranks"] if r["rank"] == 0)
    assert rank0["statistics"]["steps"] == 100 and rank0["statistics"]["dropped_batches"] == 0
    dropped = report["statistics"]["dropped_datagrams"]
    assert "0" not in dropped and dropped["1"]["over_rate"] > 0
    _no_traceback(job)


def test_a_worker_cleaning_tmpdir_loses_no_statistics_and_is_no_hang(tmp_path: Path) -> None:
    """The socket is abstract: removing the run directory (a worker cleaning $TMPDIR) leaves the
    channel as it was; the job that keeps stepping is not stopped as a hang."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = Job(tmp_path, "clean", "--steps", "200", launcher=("--hang-timeout-s", "2"), env={"TMPDIR": str(tmp)})
    assert job.code == 0, job.err
    assert "ABUSED clean" in job.proc.stdout
    assert job.steps() == {0: 200, 1: 200} and job.json["hang"] is None
    _no_traceback(job)


def test_a_long_tmpdir_and_run_id_run(tmp_path: Path) -> None:
    tmp = tmp_path
    while len(str(tmp)) < 200:
        tmp = tmp / ("x" * 60)
    tmp.mkdir(parents=True)
    run_id = "r" * MAX_RUN_ID_BYTES
    launcher = ("--run-id", run_id, "--hang-timeout-s", "5")
    job = Job(tmp_path, "none", "--steps", "10", launcher=launcher, env={"TMPDIR": str(tmp)})
    assert len(str(tmp)) >= 200 and job.code == 0, job.err
    assert job.steps() == {0: 10, 1: 10}
    _no_traceback(job)
    too_long = invoke("--nproc-per-node", "1", "--run-id", "r" * 300, WORKER)
    assert too_long.returncode == 2 and "at most 200 bytes" in too_long.stderr and "Traceback" not in too_long.stderr


@pytest.mark.parametrize("run_id", ["h", "x" * 41, "a b/c"[:3]])
def test_the_socket_name_is_short_whatever_the_run_id(run_id: str) -> None:
    ctx = run_context(run_id, "/t" * 150, 4_194_304)
    address = wire.rank_address(ctx.run_dir.socket, 1_000_000)
    assert address.startswith("\0openclaw-") and len(address.encode()) <= 107


@pytest.mark.parametrize(
    "data",
    [
        b'{"v":1,"rank":0,"steps":[[NaN,{}]]}',
        b'{"v":1,"rank":0,"steps":[[1e999,{}]]}',
        b'{"v":1,"rank":0,"steps":[[true,{}]]}',
        b'{"v":1,"rank":0,"steps":[[0.1,{"a\\nb":0.1}]]}',
        b'{"v":1,"rank":0,"steps":[[0.1,{"x":-1}]]}',
        b'{"v":1,"rank":0,"steps":[],"sync_phases":[[1]]}',
        b'{"v":1,"rank":-1,"steps":[]}',
        b'{"v":1,"rank":0,"steps":[],"pid":1}',
        b'{"v":1,"kind":"progress","rank":0,"steps":1,"phase":{}}',
        b'{"v":1,"kind":"progress","rank":0,"steps":1,"dump_signal":9}',
        b'{"v":1,"kind":"progress","rank":0,"steps":1,"gpu":[1]}',
        b'{"v":1,"kind":"progress","rank":0,"steps":1,"gpu":[-2,3]}',
        b'{"v":1,"kind":"progress","rank":0,"steps":1,"gpu":[true,3]}',
        b'{"v":1,"kind":"progress","rank":0,"steps":1,"gpu":[1.5,3]}',
        b'{"v":1,"kind":"other","rank":0,"steps":[]}',
        b"[" * 100_000,
    ],
)
def test_a_datagram_that_fails_the_check_decodes_to_none(data: bytes) -> None:
    assert wire_check.decode_any(data) is None


def test_valid_datagrams_pass_the_check_unchanged() -> None:
    batch = wire.Batch(rank=3, steps=[(0.1, {"forward": 0.04})] * wire.MAX_BATCH_STEPS, step_source="api", final=True)
    assert wire_check.decode(wire.encode(batch)) == batch
    progress = wire.Progress(3, 7, 0.2, "collective", 0.1, "all_reduce", wire.dump_signal())
    assert wire_check.decode_any(wire.encode_progress(progress)) == progress
    on_gpu = wire.Progress(3, 7, 0.2, "device-wait", 0.1, gpu=(-1, 29))  # GPU before step 0's first mark
    assert wire_check.decode_any(wire.encode_progress(on_gpu)) == on_gpu
