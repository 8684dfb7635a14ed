"""The launcher in its own process: signals forwarded, SIGKILL leaves nothing behind, PID 1 duty."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from guards import GUARD_S, wait_for
from test_supervise_run import alive, wait_gone

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise_driver.py")


def start_driver(args: list[str], prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, DRIVER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_files(paths: list[Path], proc: subprocess.Popen[str]) -> None:
    def written() -> bool:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"launcher exited {proc.returncode} early:\n{out}\n{err}")
        return all(p.exists() for p in paths)

    wait_for(written, f"workers never wrote {paths}")


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """communicate() also proves nothing left behind (the guardian) holds the launcher's pipes."""
    try:
        out, err = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        out, err = proc.communicate(timeout=GUARD_S)
        pytest.fail(f"launcher did not exit:\n{out}\n{err}")
    return proc.returncode, out, err


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """A launcher that did not exit, and every process under it: torchrun's workers are session
    leaders of their own, so killing torchrun alone would leave them (and the pipes) behind."""
    try:
        tree = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        return
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(tree, timeout=GUARD_S)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
def test_signal_forwarded_to_workers_and_exit_128_plus_sig(tmp_path: Path, sig: int) -> None:
    proc = start_driver(
        [
            "--nproc",
            "2",
            "--",
            "--log-signals",
            f"{tmp_path}/sig-{{rank}}",
            "--ready-file",
            f"{tmp_path}/ready-{{rank}}",
        ]
        + ["--sleep", "60"]
    )
    wait_files([tmp_path / "ready-0", tmp_path / "ready-1"], proc)
    proc.send_signal(sig)
    code, _, err = finish(proc)
    assert code == 128 + sig, err
    name = signal.Signals(sig).name
    for rank in (0, 1):
        assert (tmp_path / f"sig-{rank}").read_text().split() == [name]
    assert f"received {name}" in err


def test_second_sigterm_escalates_to_sigkill(tmp_path: Path) -> None:
    proc = start_driver(
        ["--nproc", "2", "--grace", "600", "--result", str(tmp_path / "result.json"), "--"]
        + [
            "--ignore-sigterm",
            "--log-signals",
            f"{tmp_path}/sig-{{rank}}",
            "--ready-file",
            f"{tmp_path}/ready-{{rank}}",
        ]
        + ["--sleep", "600"]
    )
    wait_files([tmp_path / "ready-0", tmp_path / "ready-1"], proc)
    proc.send_signal(signal.SIGTERM)
    wait_files([tmp_path / "sig-0", tmp_path / "sig-1"], proc)  # workers saw (and ignored) it
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)  # well before the 600 s grace period
    assert code == 128 + signal.SIGTERM, err
    results = json.loads((tmp_path / "result.json").read_text())["results"][0]
    assert [r["signal"] for r in results] == [signal.SIGKILL, signal.SIGKILL]


def _pids(tmp_path: Path, ranks: range) -> tuple[list[int], list[int]]:
    workers, grandchildren = [], []
    for rank in ranks:
        data = json.loads((tmp_path / f"pids-{rank}.json").read_text())
        workers.append(data["worker"])
        grandchildren += data["grandchildren"]
    return workers, grandchildren


def test_sigkilled_launcher_leaves_no_worker_or_grandchild(tmp_path: Path) -> None:
    proc = start_driver(
        ["--nproc", "2", "--", "--grandchildren", "2", "--pids-file", f"{tmp_path}/pids-{{rank}}.json"]
        + ["--sleep", "60"]
    )
    wait_files([tmp_path / "pids-0.json", tmp_path / "pids-1.json"], proc)
    workers, grandchildren = _pids(tmp_path, range(2))
    proc.kill()
    finish(proc)
    wait_gone(workers + grandchildren)


def test_sigkilled_launcher_without_guardian_workers_die_by_pdeathsig(tmp_path: Path) -> None:
    proc = start_driver(
        ["--nproc", "2", "--no-guardian", "--", "--grandchildren", "1"]
        + ["--pids-file", f"{tmp_path}/pids-{{rank}}.json", "--sleep", "60"]
    )
    wait_files([tmp_path / "pids-0.json", tmp_path / "pids-1.json"], proc)
    workers, grandchildren = _pids(tmp_path, range(2))
    proc.kill()
    finish(proc)
    try:
        wait_gone(workers)
    finally:  # without the guardian, grandchildren outlive a SIGKILLed launcher: clean up after the test
        for pid in grandchildren:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, timeout=GUARD_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="unshare --pid --fork --mount-proc refused (needs root/userns)")
def test_launcher_as_pid1_reaps_orphans_and_forwards_sigterm(tmp_path: Path) -> None:
    proc = start_driver(
        ["--nproc", "2", "--", "--orphan-child", f"{tmp_path}/orphan-{{rank}}"]
        + ["--log-signals", f"{tmp_path}/sig-{{rank}}", "--ready-file", f"{tmp_path}/ready-{{rank}}", "--sleep", "60"],
        prefix=("unshare", "--pid", "--fork", "--mount-proc"),
    )
    wait_files([tmp_path / "ready-0", tmp_path / "ready-1"], proc)
    for rank in (0, 1):  # the double-forked grandchild was reaped by PID 1, not left <defunct>
        assert (tmp_path / f"orphan-{rank}").read_text() == "reaped"
    (launcher,) = psutil.Process(proc.pid).children()  # unshare itself does not forward signals
    launcher.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    for rank in (0, 1):
        assert (tmp_path / f"sig-{rank}").read_text().split() == ["SIGTERM"]
