"""Issue 21 items 7-9: inputs, limits and signals, through the real launcher process; the usage
errors in this process (tests/cli_runner.py), each family with one case through the real entry point.

Each case asserts the exit code, that there is no traceback, and (where a job ran) that the report is
complete: duration options refuse nan/inf/huge, ``preflight --expect`` reads through the bounded
reader, ``--stats-file`` write errors reach the console and the report, a signal at start-up as
PID 1, the open-files limit for 600 ranks, ``--no-python`` with a missing command, an unwritable
report.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import Invocation, invoke
from guards import GUARD_S, wait_for
from host import signal_pid1_once_caught

LAUNCHER = [sys.executable, "-m", "openclaw_launch"]


def _launch(args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCHER, *args], capture_output=True, text=True, timeout=GUARD_S, **kw)  # type: ignore[call-overload]


def _clean(p: subprocess.CompletedProcess[str] | Invocation) -> None:
    assert "Traceback" not in p.stderr + p.stdout, p.stderr


def _report_complete(path: Path, code: int) -> dict[str, object]:
    """The report reads back as a typed report, with every rank and the job's exit code."""
    from openclaw_launch.report.build import load_report

    report = load_report(str(path))
    assert report.exit_code == code
    data = json.loads(path.read_text())
    assert data["ranks"], data
    return data


# ---- 1. every duration option refuses nan, inf and huge values at parse time ----------------------

DURATION_OPTIONS = [
    "--keepalive-s",
    "--agent-timeout-s",
    "--grace-period-s",
    "--shutdown-timeout",
    "--hang-timeout-s",
    "--stats-interval-s",
    "--kill-timeout-s",
    "--restart-backoff-s",
    "--monitor-interval",
]


@pytest.mark.parametrize("option", DURATION_OPTIONS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "1e999", "-1"])
def test_duration_options_refuse_non_finite_and_huge(option: str, value: str) -> None:
    args = ["plan", "--nproc-per-node", "1", option, value, "--no-python", "true"]
    through_the_entry_point = option == DURATION_OPTIONS[0] and value == "nan"
    p = _launch(args) if through_the_entry_point else invoke(*args)
    assert p.returncode == 2, p.stderr
    _clean(p)
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and option in line and "not a number of seconds" in line, line


@pytest.mark.parametrize("variable", ["OPENCLAW_AGENT_TIMEOUT_S", "OPENCLAW_KEEPALIVE_S", "PET_SHUTDOWN_TIMEOUT"])
def test_duration_variables_refuse_nan(variable: str) -> None:
    args, env = ["plan", "--nproc-per-node", "1", "--no-python", "true"], {**os.environ, variable: "nan"}
    through_the_entry_point = variable == "OPENCLAW_AGENT_TIMEOUT_S"
    p = _launch(args, env=env) if through_the_entry_point else invoke(*args, env=env)
    assert p.returncode == 2, p.stderr
    _clean(p)
    assert "not a number of seconds" in p.stderr


@pytest.mark.parametrize("value", [".nan", ".inf", "1.0e+300", "true"])
def test_config_duration_refuses_non_finite(tmp_path: Path, value: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"cluster:\n  nodes:\n    - name: localhost\n      cpu_workers: 1\nruntime:\n  hang_timeout_s: {value}\n"
    )
    p = invoke("plan", "--config", str(config))
    assert p.returncode == 2, p.stderr
    _clean(p)
    assert "runtime.hang_timeout_s (line 6)" in p.stderr


def test_one_rule_for_every_duration() -> None:
    from openclaw_launch.limits import MAX_SECONDS, seconds_problem

    for bad in (float("nan"), float("inf"), -float("inf"), 1e300, MAX_SECONDS * 2, -0.5):
        assert seconds_problem(bad) is not None
    assert seconds_problem(0.0) is None and seconds_problem(MAX_SECONDS) is None
    assert seconds_problem(1.0, lo=2.0) is not None


# ---- 4. start-up: signals, open files, a missing command, an unwritable report --------------------


needs_unshare = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (a PID namespace)"
)


@needs_unshare
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("delay_s", [0.0, 0.02, 0.05, 0.1])
def test_signal_at_start_up_as_pid_1(sig: int, delay_s: float) -> None:
    """As PID 1 the kernel drops a signal with the default disposition: the launcher catches the
    stopping signals before its imports, so one sent as soon as it can be caught (and at a few
    points after) ends it with 128+N, one line, no traceback."""
    # caught: startup.install ran (SIGINT's handler, installed first, is ours too; the interpreter's
    # own SIGINT handler, before any of our code, raises KeyboardInterrupt); not dropped: the job's
    # sleep 60 would end it 0
    code, output = signal_pid1_once_caught(
        [*LAUNCHER, "--nproc-per-node", "1", "--no-python", "sleep", "60"], sig, delay_s
    )
    assert code == 128 + sig, output
    assert "Traceback" not in output, output


SPY_ON_IMPORTS = """
import builtins, signal, sys
real_import, seen = builtins.__import__, []

def spy(name, *args, **kwargs):
    if name == "click" and not seen:  # the first of the command line's imports
        seen.append(name)
        print("at click:", signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, flush=True)
    return real_import(name, *args, **kwargs)

builtins.__import__ = spy
sys.argv = ["openclaw-launch", "plan", "--nproc-per-node", "1", "--no-python", "true"]
from openclaw_launch.__main__ import main
main()
"""


def test_stopping_signals_are_caught_before_the_command_line_loads() -> None:
    """The window the PID 1 test cannot time: SIGTERM is handled before click (and everything the
    command line needs) is imported, not only once launch installs its handling."""
    p = subprocess.run([sys.executable, "-c", SPY_ON_IMPORTS], capture_output=True, text=True, timeout=GUARD_S)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "at click: True", p.stdout


def test_no_python_missing_command_exits_127(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = _launch(["--nproc-per-node", "1", "--report", str(report), "--no-python", "no-such-command-xyz", "a"])
    assert p.returncode == 127, p.stderr
    _clean(p)
    assert "no-such-command-xyz" in p.stderr and "not found" in p.stderr


def test_no_python_not_executable_exits_126(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    p = _launch(["--nproc-per-node", "1", "--no-python", str(script)])
    assert p.returncode == 126, p.stderr
    _clean(p)
    assert "not executable" in p.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("code", [0, 3])
def test_unwritable_report_keeps_the_exit_code(code: int) -> None:
    p = _launch(
        [
            "--nproc-per-node",
            "1",
            "--telemetry",
            "off",
            "--report",
            "/dev/full",
            "--no-python",
            "sh",
            "-c",
            f"exit {code}",
        ]
    )
    assert p.returncode == code, p.stderr
    _clean(p)
    assert "cannot write the report /dev/full" in p.stderr and f"exit code {code} stands" in p.stderr


def _soft_limit_1024() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def test_600_ranks_under_a_soft_limit_of_1024(tmp_path: Path) -> None:
    """2 descriptors per rank: 600 ranks need more than 1024; the launcher raises its soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"the hard limit {hard} is below what 600 ranks need")
    report = tmp_path / "r.json"
    p = _launch(
        ["--nproc-per-node", "600", "--telemetry", "off", "--report", str(report), "--no-python", "true"],
        preexec_fn=_soft_limit_1024,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    _clean(p)
    data = _report_complete(report, 0)
    assert len(data["ranks"]) == 600  # type: ignore[arg-type]


def _limit_1024_both() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def test_open_files_hard_limit_too_low_is_refused_up_front() -> None:
    p = _launch(["--nproc-per-node", "600", "--no-python", "true"], preexec_fn=_limit_1024_both)
    assert p.returncode == 2, p.stderr[-2000:]
    _clean(p)
    assert "the hard limit is 1024" in p.stderr and "ulimit" in p.stderr
    assert "[rank" not in p.stderr + p.stdout  # no worker started


# ---- 2. preflight --expect through the bounded reader; outputs checked before measuring ------------

PREFLIGHT = ["preflight", "--nproc-per-node", "2"]


def _record(tiers: dict[str, object], node: str = "localhost") -> str:
    return json.dumps({"format": "openclaw-preflight-record/1", "node": node, "tiers": tiers})


def _one_error_line(p: subprocess.CompletedProcess[str] | Invocation) -> str:
    assert p.returncode == 2, p.stderr
    _clean(p)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "[rank" not in p.stdout + p.stderr  # nothing was measured
    return lines[0]


def test_expect_dev_zero() -> None:
    line = _one_error_line(invoke(*PREFLIGHT, "--expect", "/dev/zero"))
    assert "/dev/zero" in line and "not a regular file" in line


def test_expect_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "rec.fifo"
    os.mkfifo(fifo)
    line = _one_error_line(_launch([*PREFLIGHT, "--expect", str(fifo)]))  # through the entry point
    assert "a FIFO" in line


def test_expect_deep_json(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    line = _one_error_line(invoke(*PREFLIGHT, "--expect", str(deep)))
    assert "nests deeper than" in line


def test_expect_oversized(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(" " * (2 << 20))
    line = _one_error_line(invoke(*PREFLIGHT, "--expect", str(big)))
    assert "larger than" in line


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999", "true", "0", "-3", '"300"', "null", "[1]"])
def test_expect_values_are_finite_positive_numbers(tmp_path: Path, value: str) -> None:
    rec = tmp_path / "rec.json"
    rec.write_text(_record({"node": {"busbw_gbps": 1}}).replace('"busbw_gbps": 1', f'"busbw_gbps": {value}'))
    line = _one_error_line(invoke(*PREFLIGHT, "--expect", str(rec)))
    assert str(rec) in line and ("busbw_gbps" in line or "not valid JSON" in line), line


@pytest.mark.parametrize("key,value", [("size_bytes", "true"), ("size_bytes", "1.5"), ("ranks", "0")])
def test_expect_sizes_are_whole_numbers(tmp_path: Path, key: str, value: str) -> None:
    rec = tmp_path / "rec.json"
    rec.write_text(
        _record({"node": {"busbw_gbps": 1.0}}).replace('"busbw_gbps": 1.0', f'"busbw_gbps": 1.0, "{key}": {value}')
    )
    line = _one_error_line(invoke(*PREFLIGHT, "--expect", str(rec)))
    assert f"tiers.node.{key}" in line


def test_expect_from_another_topology_is_refused(tmp_path: Path) -> None:
    rec = tmp_path / "rec.json"
    rec.write_text(_record({"nvlink:0,1": {"busbw_gbps": 300.0}, "nvlink:2,3": {"busbw_gbps": 300.0}}))
    line = _one_error_line(invoke(*PREFLIGHT, "--expect", str(rec)))
    assert "another topology" in line and "nvlink:0,1" in line and "node" in line


@pytest.mark.parametrize("target", ["/proc/rec.json", "DIR", "FILE/under"])
@pytest.mark.parametrize("option", ["--record", "--report"])
def test_preflight_outputs_checked_before_measuring(tmp_path: Path, option: str, target: str) -> None:
    (tmp_path / "FILE").write_text("x")
    path = target.replace("DIR", str(tmp_path)).replace("FILE", str(tmp_path / "FILE"))
    line = _one_error_line(invoke(*PREFLIGHT, option, path))
    assert f"{option} {path}: " in line or f"'{option}'" in line, line  # ours, or click's for a directory


def test_expect_with_another_message_size_warns_and_is_not_used(tmp_path: Path) -> None:
    """A real CPU preflight: the recording (of 1 MiB all-reduces, on another node) is named in a
    warning and not used; the verdict and the run report are complete."""
    rec, report = tmp_path / "rec.json", tmp_path / "r.json"
    rec.write_text(_record({"node": {"busbw_gbps": 1000.0, "size_bytes": 1 << 20, "ranks": 2}}, node="elsewhere"))
    p = _launch([*PREFLIGHT, "--expect", str(rec), "--report", str(report), "--record", str(tmp_path / "new.json")])
    assert p.returncode == 0, p.stderr
    _clean(p)
    assert "recorded on node elsewhere; this is localhost" in p.stderr
    assert "tier node recorded with 1 MiB all-reduces, this run uses 4 MiB" in p.stderr
    assert "INFO  node  2 ranks" in p.stdout  # no floor of 1000 GB/s: not a failure
    data = _report_complete(report, 0)
    assert data["preflight"]["exit_code"] == 0  # type: ignore[index]
    saved = json.loads((tmp_path / "new.json").read_text())
    assert saved["tiers"]["node"]["size_bytes"] == 4 << 20 and saved["tiers"]["node"]["ranks"] == 2


# ---- 3. --stats-file write errors: on the console once, in the report -----------------------------

STEPPING_WORKER = """
import time
from openclaw_launch import telemetry
for _ in range(30):
    time.sleep(0.05)
    telemetry.step()
"""


def _stats_file_job(tmp_path: Path, stats_file: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    script, report = tmp_path / "steps.py", tmp_path / "r.json"
    script.write_text(STEPPING_WORKER)
    args = ["--nproc-per-node", "2", "--stats-interval-s", "0.2", "--stats-file", stats_file, "--report", str(report)]
    cmd = [*(wrap or []), *LAUNCHER, *args, str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=GUARD_S)


def _assert_stats_file_error(tmp_path: Path, p: subprocess.CompletedProcess[str], path: str) -> None:
    assert p.returncode == 0, p.stderr
    _clean(p)
    warnings = [line for line in p.stderr.splitlines() if "warning" in line and "--stats-file" in line]
    assert len(warnings) == 1, p.stderr  # once, however many lines failed
    assert path in warnings[0] and "No space left on device" in warnings[0]
    data = _report_complete(tmp_path / "r.json", 0)
    error = data["statistics"]["stats_file_error"]  # type: ignore[index]
    assert path in error and "No space left on device" in error
    assert "stats file: --stats-file" in p.stderr  # the summary says it too


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_stats_file_on_a_full_device(tmp_path: Path) -> None:
    _assert_stats_file_error(tmp_path, _stats_file_job(tmp_path, "/dev/full"), "/dev/full")


@needs_unshare
def test_stats_file_on_a_full_tmpfs_is_refused_before_the_job(tmp_path: Path) -> None:
    """A 4 KiB tmpfs, filled, mounted in a private mount namespace (gone with the launcher): a disk
    already full is found before anything starts (files.check_output_path writes a probe); a write
    that fails during the job is the /dev/full case above."""
    disk = tmp_path / "disk"
    disk.mkdir()
    stats = disk / "stats.jsonl"
    fill = f"head -c 65536 /dev/zero > {disk}/fill 2>/dev/null"  # fails once the 4 KiB are used: full
    mount = f'mount -t tmpfs -o size=4k tmpfs {disk} && {{ {fill}; exec "$@"; }}'
    p = _stats_file_job(
        tmp_path, str(stats), ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"]
    )
    assert p.returncode == 2, p.stderr
    assert "--stats-file" in p.stderr and "No space left on device" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "r.json").exists()  # nothing started
    assert not stats.exists()  # it was on the private tmpfs


# ---- the stack-dump signal does not interrupt a hung rank's blocking C calls ----------------------

BLOCKED_IN_C = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.argv[1], os.O_RDWR)  # a FIFO: read blocks until the test writes
print("ready", flush=True)
buf = ctypes.create_string_buffer(1)
n = libc.read(fd, buf, 1)  # a C call: no PEP 475 retry around it
print(f"read={n} errno={ctypes.get_errno()}", flush=True)
"""


def test_stack_dump_does_not_interrupt_blocking_c_calls(tmp_path: Path) -> None:
    """A rank blocked in read(2) gets the hang monitor's dump signal: faulthandler writes its stacks
    and the read goes on (SA_RESTART, which the bootstrap asks for; CPython's faulthandler sets it
    too) instead of returning EINTR into the library that called it. Calls Linux never restarts
    after a handler (poll, epoll_wait, nanosleep) still see EINTR: not claimed here."""
    from openclaw_launch.telemetry import wire

    script, fifo, stacks = tmp_path / "blocked.py", tmp_path / "in.fifo", tmp_path / "stacks.txt"
    script.write_text(BLOCKED_IN_C)
    os.mkfifo(fifo)
    env = {**os.environ, wire.STACKS_ENV: str(stacks)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch.telemetry.bootstrap", str(script), str(fifo)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, wire.dump_signal())
        wait_for(lambda: "blocked.py" in stacks.read_text(), "the dump was never written", poll_s=0.01)
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(writer, b"x")
        os.close(writer)
        out, err = proc.communicate(timeout=GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out.strip() == "read=1 errno=0", (out, err)  # the read went on and got the byte
    assert proc.returncode == 0 and "Traceback" not in err, err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_preflight_record_on_a_full_device_keeps_the_verdict(tmp_path: Path) -> None:
    p = _launch([*PREFLIGHT, "--record", "/dev/full", "--report", str(tmp_path / "r.json")])
    assert p.returncode == 0, p.stderr
    _clean(p)
    assert "--record /dev/full: cannot write it (No space left on device); the exit code 0 stands" in p.stderr
    _report_complete(tmp_path / "r.json", 0)


# ---- every JSON input: deep nesting, NaN, a FIFO are one line and exit 2 --------------------------


def _json_inputs(path: str) -> list[list[str]]:
    return [
        ["report", path],
        ["plan", "--nproc-per-node", "1", "--topology", path, "--no-python", "true"],
        [*PREFLIGHT, "--expect", path],
    ]


@pytest.mark.parametrize("which", range(3))
@pytest.mark.parametrize("content", ["deep", "nan", "fifo", "zero"])
def test_json_inputs_are_bounded(tmp_path: Path, which: int, content: str) -> None:
    path = tmp_path / "in.json"
    if content == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif content == "nan":
        path.write_text('{"schema": NaN}' if which != 0 else "[" * 2000 + "]" * 2000)
    elif content == "fifo":
        os.mkfifo(path)
    target = "/dev/zero" if content == "zero" else str(path)
    args, through_the_entry_point = _json_inputs(target)[which], which == 0 and content == "deep"
    p = _launch(args) if through_the_entry_point else invoke(*args)
    assert p.returncode == 2, p.stderr
    _clean(p)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert target in p.stderr
