"""supervise() in this process with real fake workers: exit codes, root cause, teardown, logs, binding."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from guards import wait_for
from supervise_driver import make_plan

from openclaw_launch.errors import LaunchError
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, format_root_cause, supervise


def alive(pid: int) -> bool:
    """Running, not a zombie (zombies of reparented orphans may linger under this process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: gone between open and read
        return False


def recorded_pids(directory: Path) -> list[int]:
    """Workers and grandchildren from every ``pids-*`` file that fake_worker --pids-file wrote there."""
    pids: list[int] = []
    for f in sorted(directory.glob("pids-*")):
        if f.suffix == ".tmp":  # a worker stopped between its write and the rename (fake_worker._write)
            continue
        data = json.loads(f.read_text())
        pids += [data["worker"], *data["grandchildren"]]
    return pids


def wait_gone(pids: list[int], what: str = "outlived the job") -> None:
    """Every one of ``pids`` ends (a process dies a moment after its SIGKILL; one that does not fails)."""
    wait_for(lambda: not any(alive(p) for p in pids), lambda: f"{what}: {[p for p in pids if alive(p)]}")


def run(n: int, args: list[str], **kw: object) -> tuple[JobResult, str, str]:
    out, err = io.StringIO(), io.StringIO()
    plan_kw = {k: kw.pop(k) for k in ("prefix", "cpus", "error_dir") if k in kw}
    options = SuperviseOptions(stdout=out, stderr=err, **kw)  # type: ignore[arg-type]
    result = supervise(make_plan(n, args, **plan_kw), options)  # type: ignore[arg-type]
    return result, out.getvalue(), err.getvalue()


def test_all_succeed_exit_0() -> None:
    result, out, _ = run(3, ["--stdout", "ok"])
    assert result.exit_code == 0
    assert result.root_cause is None and result.attempts == 1
    assert [r.exit_code for r in result.results[0]] == [0, 0, 0]
    assert all(r.cpu_s is not None and r.max_rss_kib for r in result.results[0])
    assert sorted(out.splitlines()) == ["[rank 0] ok", "[rank 1] ok", "[rank 2] ok"]


def test_failure_stops_others_and_names_root_cause(tmp_path: Path) -> None:
    result, _, err = run(
        3, ["--only-rank", "1", "--exit", "3", "--stderr", "dying now", "--sleep", "60"], grace_period_s=2.0
    )
    assert result.exit_code == 3
    assert result.root_cause is not None and result.root_cause.rank == 1
    others = [r for r in result.results[0] if r.rank != 1]
    assert all(r.signal == signal.SIGTERM for r in others)
    assert "rank 1" in err and "exited with code 3" in err and "dying now" in err


def test_segfault_is_139_and_named() -> None:
    result, _, err = run(2, ["--only-rank", "0", "--segfault", "--sleep", "60"])
    assert result.exit_code == 139
    assert result.root_cause is not None and result.root_cause.signal == signal.SIGSEGV
    assert "SIGSEGV" in format_root_cause(result.root_cause) and "SIGSEGV" in err


def test_raise_shows_traceback_tail() -> None:
    result, _, _ = run(2, ["--only-rank", "1", "--raise", "--sleep", "60"])
    assert result.exit_code == 1
    assert result.root_cause is not None
    assert any("RuntimeError: fake failure on rank 1" in line for line in result.root_cause.stderr_tail)


def test_sigterm_ignorer_is_sigkilled_after_grace(tmp_path: Path) -> None:
    ready = str(tmp_path / "ready-{rank}")
    result, _, _ = run(
        2,
        ["--only-rank", "0", "--exit", "1", "--ignore-sigterm", "--sleep", "60", "--ready-file", ready]
        + ["--wait-for", ready.format(rank=1)],
        grace_period_s=0.5,
    )
    assert result.exit_code == 1
    stubborn = result.results[0][1]
    assert stubborn.signal == signal.SIGKILL
    assert stubborn.pid is not None and not alive(stubborn.pid)


@pytest.mark.parametrize("setsid", [False, True], ids=["same-group", "own-session"])
def test_grandchildren_die_on_failure(tmp_path: Path, setsid: bool) -> None:
    pids_file = str(tmp_path / "pids-{rank}.json")
    args = ["--grandchildren", "2", "--pids-file", pids_file, "--sleep", "60"]
    args += ["--setsid-grandchildren"] if setsid else []
    # rank 1 fails only once rank 0 has written its grandchildren's pids
    args += ["--wait-for", str(tmp_path / "pids-0.json"), "--only-rank", "1", "--exit", "5"]
    result, _, _ = run(2, args, grace_period_s=2.0)
    assert result.exit_code == 5
    grandchildren = []
    for rank in (0, 1):
        grandchildren += json.loads((tmp_path / f"pids-{rank}.json").read_text())["grandchildren"]
    assert len(grandchildren) == 4
    wait_gone(grandchildren)
    assert result.unkillable == ()


def test_grandchildren_die_after_success(tmp_path: Path) -> None:
    pids_file = str(tmp_path / "pids-{rank}.json")
    result, _, _ = run(1, ["--grandchildren", "2", "--setsid-grandchildren", "--pids-file", pids_file])
    assert result.exit_code == 0
    grandchildren = json.loads((tmp_path / "pids-0.json").read_text())["grandchildren"]
    wait_gone(grandchildren)


def test_orphaned_grandchild_is_reaped_by_the_subreaper(tmp_path: Path) -> None:
    result, _, _ = run(1, ["--orphan-child", str(tmp_path / "orphan")])
    assert result.exit_code == 0
    assert (tmp_path / "orphan").read_text() == "reaped"


def test_restart_counts_attempts(tmp_path: Path) -> None:
    env_file = str(tmp_path / "env-{rank}-{attempt}.json")
    result, _, _ = run(
        2,
        ["--only-rank", "1", "--fail-below-attempt", "1", "--exit", "7", "--write-env", env_file],
        max_restarts=3,
        restart_backoff_s=0.01,
    )
    assert result.exit_code == 0
    assert result.attempts == 2
    assert result.results[0][1].exit_code == 7 and result.results[1][1].exit_code == 0
    for attempt in (0, 1):
        environ = json.loads((tmp_path / f"env-1-{attempt}.json").read_text())["environ"]  # written before failing
        assert environ["TORCHELASTIC_RESTART_COUNT"] == str(attempt)  # overrides the plan's "99"


def test_restarts_run_out() -> None:
    result, _, _ = run(1, ["--exit", "4"], max_restarts=1, restart_backoff_s=0.01)
    assert result.exit_code == 4 and result.attempts == 2
    assert result.root_cause is not None and result.root_cause.attempt == 1


def test_logs_per_rank_and_prefixed_console(tmp_path: Path) -> None:
    args = ["--stdout", "out line", "--stderr", "partial err", "--no-newline"]
    result, out, err = run(2, args, log_dir=str(tmp_path), prefix_template="<{node}:{rank}> ")
    assert result.exit_code == 0
    for rank in (0, 1):
        base = tmp_path / "test-run" / "attempt-0" / f"rank-{rank}"
        assert (base / "stdout.log").read_text() == "out line"
        assert (base / "stderr.log").read_text() == "partial err"
        assert f"<node0:{rank}> out line" in out.splitlines()
        assert f"<node0:{rank}> partial err" in err.splitlines()  # partial line flushed at EOF


def test_console_ranks_filter(tmp_path: Path) -> None:
    result, out, _ = run(3, ["--stdout", "hello"], console_ranks=frozenset({2}), log_dir=str(tmp_path))
    assert result.exit_code == 0
    assert out.splitlines() == ["[rank 2] hello"]
    assert (tmp_path / "test-run" / "attempt-0" / "rank-0" / "stdout.log").read_text() == "hello\n"


def test_error_file_in_summary(tmp_path: Path) -> None:
    result, _, err = run(2, ["--only-rank", "0", "--error-file", "--sleep", "60"], error_dir=str(tmp_path))
    assert result.exit_code == 1
    root = result.root_cause
    assert root is not None and root.rank == 0
    assert root.error is not None and root.error.startswith("ValueError: bad batch shape (fake)")
    assert "Traceback (most recent call last)" in root.error
    assert "bad batch shape (fake)" in err and "error file" in err


def test_spawn_failure_is_127() -> None:
    result, _, err = run(2, ["--sleep", "60"], prefix=("/nonexistent/numactl",))
    assert result.exit_code == 127
    assert result.root_cause is not None and result.root_cause.pid is None
    assert "could not start" in err


numactl = pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")


@numactl
def test_binding_readback_matches(tmp_path: Path) -> None:
    result, _, err = run(1, ["--sleep", "1.0"], prefix=("numactl", "--physcpubind=0"), cpus=(0,), readback_delay_s=0.01)
    assert result.exit_code == 0
    r = result.results[0][0]
    assert r.bound_cpus == (0,)
    assert r.bound_mems is not None
    assert r.binding_warning is None and "warning" not in err


@numactl
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to plan a wider binding")
def test_binding_readback_warns_when_narrower_than_plan() -> None:
    result, _, err = run(
        2, ["--sleep", "1.0"], prefix=("numactl", "--physcpubind=0"), cpus=(0, 1), readback_delay_s=0.01
    )
    assert result.exit_code == 0
    for r in result.results[0]:
        assert r.bound_cpus == (0,)
        assert r.binding_warning is not None and "plan says 0-1" in r.binding_warning
    assert err.count("warning") == 2  # once per rank


def _live_children() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)]


def test_unwritable_log_dir_is_a_launch_error_and_leaves_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "test-run" / "attempt-0" / "rank-1"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where rank 1's log directory should go")
    with pytest.raises(LaunchError, match="writable --log-dir"):
        run(2, ["--ready-file", str(tmp_path / "ready-{rank}"), "--sleep", "60"], log_dir=str(tmp_path))
    assert _live_children() == []
    assert not list(tmp_path.glob("ready-*"))  # checked before any worker started, rank 0 included


class ExplodingConsole(io.StringIO):
    def write(self, text: str) -> int:
        raise RuntimeError("console exploded")


def test_unexpected_error_still_kills_workers_and_grandchildren(tmp_path: Path) -> None:
    pids_file = str(tmp_path / "pids-{rank}.json")
    options = SuperviseOptions(stdout=ExplodingConsole(), stderr=io.StringIO())
    plan = make_plan(2, ["--grandchildren", "1", "--pids-file", pids_file, "--stdout", "boom", "--sleep", "60"])
    with pytest.raises(RuntimeError, match="console exploded"):
        supervise(plan, options)
    assert _live_children() == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert signal.set_wakeup_fd(-1) == -1
