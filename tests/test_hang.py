"""Hang detection and live metrics (issue 10): the pure verdict, and real gloo jobs on the CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO

import psutil
import pytest
from cli_runner import invoke
from guards import GUARD_S, wait_for

from openclaw_launch.codec import from_json, to_json
from openclaw_launch.run.participant import StopKind, StopReason
from openclaw_launch.stats.hang import HANG_EXIT_CODE, HangWatch
from openclaw_launch.stats.hang_monitor import HangMonitor, HangOs, excerpt
from openclaw_launch.stats.result import Hang
from openclaw_launch.telemetry import wire, wire_check

WORKER = str(Path(__file__).parent / "telemetry_workers" / "hang.py")
STEPPER = str(Path(__file__).parent / "telemetry_workers" / "stepper.py")  # no torch, no collective
ROOT = str(Path(__file__).parent.parent)


# ---- the verdict, pure ---------------------------------------------------------------------------


def _progress(rank: int, steps: int, step_age: float, phase: str | None, phase_age: float) -> wire.Progress:
    return wire.Progress(rank, steps, step_age, phase, phase_age, "all_reduce", dump_signal=None)


def test_a_straggler_is_not_a_hang_but_a_silent_rank_is() -> None:
    w = HangWatch(5.0, [(0, 0, "n"), (1, 1, "n")])
    w.reset(0.0)
    w.on_spawn(1, 101)
    for t in range(0, 60, 4):  # rank 1 steps every 4 s (slow), rank 0 every 1 s: no hang
        w.on_progress(_progress(0, t + 1, 0.0, "compute", 0.1), float(t))
        w.on_progress(_progress(1, t // 4 + 1, 0.0, "compute", 0.1), float(t))
        assert w.check(float(t) + 3.9) is None
    # rank 1 stops in a pure-Python loop (no phase); rank 0 waits in its all-reduce
    w.on_progress(_progress(0, 99, 0.0, wire.COLLECTIVE, 0.0), 60.0)
    w.on_progress(_progress(1, 20, 0.0, None, 0.0), 60.0)
    assert w.check(64.9) is None
    verdict = w.check(65.0)
    assert verdict is not None and verdict.all_silent
    assert [h.rank for h in verdict.stuck] == [1]
    assert verdict.ranks[1].phase == wire.COLLECTIVE and not verdict.ranks[1].stuck
    assert "rank 1 (local rank 1, node n, pid 101) in other for 5.0 s" in verdict.stuck[0].describe()


def test_one_silent_rank_while_the_others_step_and_all_waiting_names_all() -> None:
    w = HangWatch(2.0, [(0, 0, "n"), (1, 1, "n"), (2, 2, "n")])
    w.on_progress(_progress(0, 3, 0.0, None, 0.0), 0.0)
    w.on_progress(_progress(1, 3, 0.0, None, 0.0), 0.0)
    w.on_progress(_progress(2, 3, 0.0, wire.COLLECTIVE, 0.0), 0.0)
    for r in (0, 1):
        w.on_progress(_progress(r, 10, 0.0, None, 0.0), 1.9)
    verdict = w.check(2.0)
    assert verdict is not None and not verdict.all_silent
    assert [h.rank for h in verdict.ranks] == [2] and verdict.ranks[0].stuck  # only waiting ones: all named
    w.reset(10.0)
    assert w.check(100.0) is None  # not armed: no step yet


def test_monitor_signals_every_rank_reads_stacks_and_asks_for_124(tmp_path: Path) -> None:
    clock = [0.0]
    sent: list[tuple[int, int]] = []
    files = {r: str(tmp_path / f"s{r}") for r in (0, 1)}
    for r, f in files.items():
        Path(f).write_text(
            f"Thread 0x1 (most recent call first):\n  File 'x', line 1 in t\n\nCurrent thread 0x2:\n  rank{r}\n"
        )
    said: list[str] = []
    hos = HangOs(kill=lambda pid, sig: sent.append((pid, sig)), monotonic=lambda: clock[0], find_py_spy=lambda: None)
    m = HangMonitor(
        HangWatch(2.0, [(0, 0, "n"), (1, 1, "n")]), said.append, files, lambda r, a: str(tmp_path / f"log{r}"), hos
    )
    m.begin_attempt(0)
    for r in (0, 1):
        m.on_spawn(r, 10 + r)  # the pids the launcher spawned: the only ones it signals
        m.on_datagram(wire.Progress(r, 4, 0.0, None, 0.0, None, dump_signal=wire.dump_signal()))
    m.tick()
    assert m.stop_reason() is None and not sent
    clock[0] = 2.0
    m.tick()
    assert sorted(sent) == [(10, wire.dump_signal()), (11, wire.dump_signal())] and m.stop_reason() is None
    clock[0] = 3.5
    m.tick()
    reason = m.stop_reason()
    assert reason is not None and reason.exit_code == HANG_EXIT_CODE and not reason.restartable
    assert reason.kind is StopKind.HANG and reason.rank == 0 and not m.vote_restart(0, True)
    hang = m.result()
    assert hang is not None and hang.stack_source == "faulthandler"
    assert hang.ranks[0].stack[:2] == ("Current thread 0x2:", "  rank0")
    assert from_json(Hang, json.loads(json.dumps(to_json(hang)))) == hang  # the report's type, as the codec writes it
    assert "rank1" in (tmp_path / "log1").read_text()
    assert any("stopping the job (exit code 124)" in s for s in said)


def test_a_new_attempt_starts_the_watch_afresh_and_a_hang_in_it_is_judged_on_its_own_steps(tmp_path: Path) -> None:
    """Attempt 0 hangs (the monitor ends in its stop state), the job restarts anyway (in the test:
    another node's failure won), attempt 1 steps, then rank 1 stops: detected one timeout after its
    own last step of attempt 1, not at once from attempt 0's state; a failure after a verdict
    never restarts."""
    clock = [0.0]
    hos = HangOs(kill=lambda pid, sig: None, monotonic=lambda: clock[0], find_py_spy=lambda: None)
    said: list[str] = []
    m = HangMonitor(HangWatch(2.0, [(0, 0, "n"), (1, 1, "n")]), said.append, {}, lambda r, a: None, hos)

    def steps(at: float, ranks: tuple[int, ...] = (0, 1)) -> None:
        clock[0] = at
        for r in ranks:
            m.on_datagram(wire.Progress(r, int(at * 10), 0.0, None, 0.0, None, dump_signal=None))
        m.tick()

    m.begin_attempt(0)
    steps(1.0)
    steps(3.5, ranks=(0,))
    steps(4.0, ranks=(0,))  # no dump signal announced: straight to the stop
    assert m.stop_reason() is not None and not m.vote_restart(0, True)
    m.begin_attempt(1)
    assert m.stop_reason() is None and m.verdict is None and m.vote_restart(1, True)
    for t in (4.5, 5.0, 5.5, 6.0):
        steps(t)
        assert m.stop_reason() is None
    for t in (7.0, 7.9):
        steps(t, ranks=(0,))
        assert m.stop_reason() is None, "judged on attempt 0's state"
    steps(8.1, ranks=(0,))
    steps(8.2, ranks=(0,))
    reason = m.stop_reason()
    assert reason is not None and reason.rank == 1 and m.attempt == 1
    m.begin_attempt(2)
    steps(9.0)
    m.on_stop(StopReason(StopKind.FAILURE, 3, "rank 0 exited 3", True, "n", 0))
    steps(12.0, ranks=())  # the node is stopping: its ranks stop stepping, which is no hang
    assert m.stop_reason() is None and m.vote_restart(2, True)


def test_excerpt_is_bounded() -> None:
    text = "Current thread 0x1:\n" + "".join(f"  File 'f', line {i}\n" for i in range(100))
    out = excerpt(text, 10)
    assert len(out) == 11 and out[-1].startswith("... (91 more")


# ---- real jobs -------------------------------------------------------------------------------------


class Job:
    """The launcher as a user runs it; its stderr lines with the time each arrived."""

    def __init__(
        self,
        tmp: Path,
        launcher_args: list[str],
        worker_args: list[str],
        nproc: int = 2,
        worker: str = WORKER,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.marker = f"mark-{os.getpid()}-{time.monotonic_ns()}"
        self.report = tmp / "report.json"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "openclaw_launch",
                "--nproc-per-node",
                str(nproc),
                "--report",
                str(self.report),
                "--log-dir",
                str(tmp / "logs"),
                "--run-id",
                "h",
                "--grace-period-s",
                "3",
                "--stats-interval-s",
                "1",
                *launcher_args,
                worker,
                "--marker",
                self.marker,
                *worker_args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **(env or {})},
        )
        self.err: list[tuple[float, str]] = []
        self.out: list[tuple[float, str]] = []
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.err), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stdout, self.out), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: IO[str], into: list[tuple[float, str]]) -> None:
        for line in stream:
            into.append((time.time(), line.rstrip("\n")))

    def wait(self) -> int:
        code = self.proc.wait(timeout=GUARD_S)
        for t in self._threads:
            t.join(timeout=GUARD_S)
        return code

    def first(self, lines: list[tuple[float, str]], pattern: str) -> tuple[float, str]:
        for at, line in lines:
            if re.search(pattern, line):
                return at, line
        raise AssertionError(f"no line matches {pattern!r} in:\n" + "\n".join(line for _, line in lines))

    def leftovers(self) -> list[int]:
        return [p.pid for p in psutil.process_iter(["cmdline"]) if self.marker in " ".join(p.info["cmdline"] or ())]


def _blocking_line(mode: str) -> int:
    lines = Path(WORKER).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# BLOCKS-HERE {mode}" in line)


@pytest.mark.parametrize("mode", ["sleep", "read", "barrier"])
def test_a_hung_rank_is_named_with_its_stack_and_the_job_ends(tmp_path: Path, mode: str) -> None:
    timeout_s = 2.0
    job = Job(tmp_path, ["--hang-timeout-s", str(timeout_s)], ["--mode", mode, "--rank", "1", "--at", "4"])
    code = job.wait()
    assert code == HANG_EXIT_CODE, "\n".join(line for _, line in job.err)
    hung_at, _ = job.first(job.out, r"HANGING")
    hung_at = float(job.first(job.out, r"HANGING")[1].split()[-1])
    named_at, _ = job.first(job.err, r"^openclaw-launch: hang: no step for")
    assert named_at - hung_at <= timeout_s + 2.0
    report = json.loads(job.report.read_text())
    hang = report["hang"]
    assert report["exit_code"] == HANG_EXIT_CODE and hang["stack_source"] == "faulthandler"
    stuck = [r["rank"] for r in hang["ranks"] if r["stuck"]]
    line = _blocking_line(mode)
    log = (tmp_path / "logs" / "h" / "attempt-0" / "rank-1" / "stderr.log").read_text()
    assert f'hang.py", line {line} in main' in log
    if mode == "barrier":  # every rank waits for a peer: all are named, each with what it waits in
        assert sorted(stuck) == [0, 1] and hang["all_silent"]
        by_rank = {r["rank"]: r for r in hang["ranks"]}
        assert by_rank[1]["phase"] == "collective" and by_rank[1]["collective"] == "barrier"
        assert by_rank[0]["phase"] == "sync"
        log0 = (tmp_path / "logs" / "h" / "attempt-0" / "rank-0" / "stderr.log").read_text()
        assert f'hang.py", line {_blocking_line("waiting")} in main' in log0
    else:  # rank 1 stopped; rank 0 waits for it in its all-reduce
        assert stuck == [1]
        waiting = next(r for r in hang["ranks"] if r["rank"] == 0)
        assert waiting["phase"] == "collective" and waiting["collective"] == "all_reduce"
        shown = "\n".join(line for _, line in job.err)
        assert f'hang.py", line {line} in main' in shown  # the stuck rank's stack on the console
    assert job.leftovers() == []


def test_after_a_hang_no_restart_even_with_max_restarts(tmp_path: Path) -> None:
    job = Job(
        tmp_path,
        ["--hang-timeout-s", "2", "--max-restarts", "2", "--restart-backoff-s", "0.1"],
        ["--hang-rank", "1", "--hang-at", "5"],
        worker=STEPPER,
    )
    assert job.wait() == HANG_EXIT_CODE, "\n".join(line for _, line in job.err)
    report = json.loads(job.report.read_text())
    assert report["exit_code"] == HANG_EXIT_CODE and report["attempts"] == 1
    assert [r["rank"] for r in report["hang"]["ranks"] if r["stuck"]] == [1]
    assert not [line for _, line in job.err if "openclaw-launch: attempt 2/" in line]
    assert job.leftovers() == []


def test_a_failure_restarts_and_a_hang_in_the_next_attempt_is_detected_on_its_own_steps(tmp_path: Path) -> None:
    """The hang watch starts afresh per attempt: rank 1 exits 7 in attempt 0 (a restart), hangs in attempt 1."""
    timeout_s = 2.0
    job = Job(
        tmp_path,
        ["--hang-timeout-s", str(timeout_s), "--max-restarts", "1", "--restart-backoff-s", "0.1"],
        ["--exit-rank", "1", "--exit-at", "5", "--exit-attempts", "0"]
        + ["--hang-rank", "1", "--hang-at", "8", "--hang-attempts", "1"],
        worker=STEPPER,
    )
    assert job.wait() == HANG_EXIT_CODE, "\n".join(line for _, line in job.err)
    hung_at = float(job.first(job.out, r"HANGING rank 1 attempt 1")[1].split()[-1])
    named_at, _ = job.first(job.err, r"^openclaw-launch: hang: no step for")
    assert 0 <= named_at - hung_at <= timeout_s + 2.0
    report = json.loads(job.report.read_text())
    assert report["exit_code"] == HANG_EXIT_CODE and report["attempts"] == 2
    assert [r["rank"] for r in report["hang"]["ranks"] if r["stuck"]] == [1]
    assert [h["root_cause"]["exit_code"] if h["root_cause"] else None for h in report["attempt_history"]] == [7, None]
    assert job.leftovers() == []


def test_a_straggler_with_the_hang_timeout_on_finishes_normally_and_metrics_are_live(tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.jsonl"
    job = Job(
        tmp_path,
        ["--hang-timeout-s", "2", "--metrics-port", "0", "--stats-file", str(stats_file)],
        ["--mode", "slow", "--rank", "1", "--slow-ms", "150", "--steps", "30"],
    )
    port = wait_for(
        lambda: next(
            (m.group(1) for _, line in job.err if (m := re.search(r"metrics on http://[^:]+:(\d+)/", line))), None
        ),
        "the launcher never said where its metrics are",
        poll_s=0.1,
    )
    from prometheus_client.parser import text_string_to_metric_families

    ranks: set[str] = set()

    def both_ranks_stepped_or_the_job_ended() -> bool:
        nonlocal ranks
        if job.proc.poll() is not None:
            return True
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=GUARD_S).read().decode()
        except OSError:
            return True
        families = {f.name: f for f in text_string_to_metric_families(text)}
        steps = families.get("openclaw_steps")
        if steps is None:
            return False
        ranks = {s.labels["rank"] for s in steps.samples if s.value > 0}
        if ranks == {"0", "1"} and "openclaw_step_time_seconds" in families:
            labels = steps.samples[0].labels
            assert set(labels) >= {"run_id", "node", "rank", "local_rank", "gpu_uuid"}
            assert labels["run_id"] == "h"
            return True
        return False

    wait_for(both_ranks_stepped_or_the_job_ended, "the metrics never showed both ranks", poll_s=0.3)
    assert ranks == {"0", "1"}
    assert job.wait() == 0, "\n".join(line for _, line in job.err)
    report = json.loads(job.report.read_text())
    assert report["hang"] is None
    lines = [json.loads(line) for line in stats_file.read_text().splitlines()]
    assert lines and [r["rank"] for r in lines[-1]["ranks"]] == [0, 1] and lines[-1]["ranks"][1]["steps"] > 0
    assert job.leftovers() == []


def test_hang_timeout_and_metrics_with_telemetry_off_say_so(tmp_path: Path) -> None:
    job = Job(tmp_path, ["--hang-timeout-s", "2", "--telemetry", "off"], ["--steps", "2"], nproc=1)
    assert job.wait() == 0
    job.first(job.err, r"--telemetry off: no progress from the workers")


def test_config_key_and_option_share_the_bound(tmp_path: Path) -> None:
    from openclaw_launch.config.reader import parse_config
    from openclaw_launch.errors import ConfigError
    from openclaw_launch.limits import MIN_HANG_TIMEOUT_S

    base = "cluster:\n  nodes:\n    - name: a\n      cpu_workers: 1\nruntime:\n  hang_timeout_s: {}\n"
    assert parse_config(base.format("90")).runtime.hang_timeout_s == 90.0
    assert parse_config(base.format("2.5")).runtime.hang_timeout_s == 2.5
    for bad in ("1", ".nan", "'10'", "true"):
        with pytest.raises(ConfigError, match="hang_timeout_s"):
            parse_config(base.format(bad))
    result = invoke("--nproc-per-node", "1", "--hang-timeout-s", str(MIN_HANG_TIMEOUT_S / 2), "x.py")
    assert result.returncode == 2 and "--hang-timeout-s" in result.stderr


def test_progress_thread_reports_the_phase_a_rank_is_blocked_in(tmp_path: Path) -> None:
    import socket

    from openclaw_launch.telemetry.recorder import Recorder

    path = str(tmp_path / "s")
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(path)
    inbox.settimeout(GUARD_S)
    rec = Recorder(path, 3)
    rec.step("api")
    rec.enter(wire.COLLECTIVE, "barrier")  # entered right after the boundary: still reported
    rec.start_progress(0.05)
    try:
        got = wire_check.decode_any(inbox.recv(1 << 16))
        assert isinstance(got, wire.Progress)
        assert (got.rank, got.steps, got.phase, got.collective) == (3, 1, "collective", "barrier")  # 1 boundary: 1 step
    finally:
        rec.close()
        inbox.close()
