"""What torchrun users rely on besides the command line, with real processes: two one-node jobs on
one host (also with MASTER_PORT/MASTER_ADDR exported, and on torchtitan's port-0 line, under both
launchers), a 30 s grace period for a checkpointing SIGTERM handler, output of a SIGKILLed worker, a
progress bar drawn with \\r, the launcher's own TORCHELASTIC_ERROR_FILE, every attempt's error file,
the console of --redirects with --tee, and every PET_* variable under both launchers (torchrun's
side from its recording, tests/torchrun_recording.py, but for one PET_* variable)."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from guards import wait_for
from host import needs_torch
from test_supervise_signals import finish, wait_files
from torchrun_recording import SIDES, case_sides, torchrun_side

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/compat_worker.py"


def start(*args: str, env: dict[str, str] | None = None, launcher: str = "openclaw_launch") -> subprocess.Popen[str]:
    """A launcher on ``args``: ours, or torchrun with ``launcher="torch.distributed.run"``."""
    return subprocess.Popen(
        [sys.executable, "-m", launcher, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@needs_torch
def test_two_one_node_jobs_on_one_host_both_succeed() -> None:
    """Each gets its own free MASTER_PORT; both gloo worlds form (the old fixed 29500 collided)."""
    jobs = [start("--nproc-per-node", "2", "tests/allreduce_worker.py") for _ in range(2)]
    for job in jobs:
        code, out, err = finish(job)
        assert code == 0, err
        assert "sum 1" in out


TORCHRUN = "torch.distributed.run"


def formed_worlds(jobs: list[subprocess.Popen[str]]) -> list[list[int]]:
    """Each all-reduce job's exit code and how many of its two ranks printed the sum."""
    return [[code, out.count("sum 1")] for code, out, _ in map(finish, jobs)]


@needs_torch
@pytest.mark.parametrize("side", SIDES)
def test_master_port_and_addr_of_the_shell_are_ignored_as_by_torchrun(side: str) -> None:
    """Two one-node jobs of each launcher at once, in a shell that exports MASTER_PORT (a port this
    test holds, so a launcher that obeyed it would fail) and an unresolvable MASTER_ADDR: every job
    forms its world; ours says once what it ignored and what to use instead."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        shell = {"MASTER_PORT": str(taken.getsockname()[1]), "MASTER_ADDR": "no-such-host.invalid"}
        line = ["--nproc-per-node", "2", "tests/allreduce_worker.py"]
        ours = [start(*line, env=shell) for _ in range(2)]

        def theirs() -> list[list[int]]:
            return formed_worlds([start(*line, env=shell, launcher=TORCHRUN) for _ in range(2)])

        assert torchrun_side("behaviour/shell_master_port_and_addr", side, theirs) == [[0, 2], [0, 2]]
        for job in ours:
            code, out, err = finish(job)
            assert code == 0 and out.count("sum 1") == 2, err
            (warning,) = [line for line in err.splitlines() if "launching environment" in line]
            assert f"MASTER_PORT={shell['MASTER_PORT']}" in warning and "--master-port" in warning


@needs_torch
@pytest.mark.parametrize("side", SIDES)
def test_two_port_0_jobs_at_once_under_both_launchers(tmp_path: Path, side: str) -> None:
    """torchtitan's run_train.sh line (c10d, localhost:0), twice at once under each launcher: every
    world forms on its own free port, and our report names the port its workers got."""
    line = ["--nproc_per_node=2", "--rdzv_backend", "c10d", "--rdzv_endpoint=localhost:0", "--role", "rank"]
    reports = [tmp_path / f"run-{k}.json" for k in range(2)]
    ours = [start(*line, "--report", str(report), "tests/allreduce_worker.py") for report in reports]

    def theirs() -> list[list[int]]:
        return formed_worlds([start(*line, "tests/allreduce_worker.py", launcher=TORCHRUN) for _ in range(2)])

    assert torchrun_side("behaviour/two_port_0_jobs", side, theirs) == [[0, 2], [0, 2]]
    assert formed_worlds(ours) == [[0, 2], [0, 2]]
    ports = {json.loads(report.read_text())["master_port"] for report in reports}
    assert len(ports) == 2 and 0 not in ports and None not in ports


@pytest.mark.parametrize("side", SIDES)
def test_every_attempts_error_file_is_kept_as_under_torchrun(tmp_path: Path, side: str) -> None:
    """--max-restarts 1, rank 1 fails both attempts with an @record error file: both attempts' files
    stay under either launcher, and our summary names the last attempt's (the root cause)."""
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1", "--rdzv-id", "e"]
    worker = ["--no-python", sys.executable, "tests/fake_worker.py", "--only-rank", "1", "--error-file"]
    job = start(*args, "--log-dir", str(tmp_path / "openclaw"), *worker)

    def theirs() -> list[list[str]]:
        logs = tmp_path / "torchrun"
        code, _, err = finish(start(*args, "--log-dir", str(logs), *worker, launcher=TORCHRUN))
        assert code != 0, err
        return sorted(list(p.relative_to(logs).parts[1:]) for p in logs.glob("*/attempt_*/1/error.json"))

    expected = [["attempt_0", "1", "error.json"], ["attempt_1", "1", "error.json"]]
    assert torchrun_side("behaviour/every_attempts_error_file", side, theirs) == expected
    code, _, err = finish(job)
    assert code != 0, err
    ours = [tmp_path / "openclaw" / "e" / "errors" / f"attempt-{n}" / "rank-1" / "error.json" for n in (0, 1)]
    assert all(json.loads(f.read_text())["message"]["message"].startswith("ValueError") for f in ours)
    assert f"error file {ours[1]}" in err and f"error file {ours[0]}" not in err


#: --redirects and --tee together (Megatron-LM passes -r 3 -t 3): a teed stream stays on the
#: console, per stream and per local rank, single values and mappings mixed
REDIRECTED_AND_TEED = {
    "both_3": ["--redirects", "3", "--tee", "3"],
    "tee_stdout": ["-r", "3", "-t", "1"],
    "tee_mapping": ["-r", "3", "-t", "0:2"],
    "redirect_mapping": ["-r", "0:3,1:1", "-t", "2"],
}


@pytest.mark.parametrize(("case", "side"), case_sides(REDIRECTED_AND_TEED))
def test_teed_streams_stay_on_the_console_as_under_torchrun(tmp_path: Path, case: str, side: str) -> None:
    """Which local rank's streams reach which console stream: the same under both launchers."""
    args = ["--nproc-per-node", "2", *REDIRECTED_AND_TEED[case]]

    def console(launcher: str) -> list[list[str]]:
        logs = tmp_path / launcher
        code, out, err = finish(start(*args, "--log-dir", str(logs), WORKER, "--say", launcher=launcher))
        assert code == 0, err
        return sorted(
            [name, word]
            for name, text in (("stdout", out), ("stderr", err))
            for word in re.findall(r"say-\d-\w+", text)
        )

    assert console("openclaw_launch") == torchrun_side(
        f"behaviour/teed_console/{case}", side, lambda: console(TORCHRUN)
    )


@pytest.mark.parametrize(
    ("flags", "kept"), [(["-t", "3"], False), (["-r", "3", "-t", "3"], False), (["-r", "1"], True)]
)
def test_redirects_and_tee_without_log_dir_leave_a_directory_only_for_what_the_console_lacks(
    tmp_path: Path, flags: list[str], kept: bool
) -> None:
    """-t (and -r that -t covers) shows everything on the console: no openclaw-logs-* is made. A
    stream -r keeps off the console exists only in its log: that directory stays, and is named
    (torchrun leaves /tmp/torchelastic_* either way, unnamed)."""
    code, out, err = finish(start("--nproc-per-node", "1", *flags, WORKER, "--say", env={"TMPDIR": str(tmp_path)}))
    assert code == 0, err
    left = list(tmp_path.glob("openclaw-logs-*"))
    assert "say-0-stderr" in err
    if not kept:
        assert left == [] and "say-0-stdout" in out and "--log-dir" not in err
        return
    assert len(left) == 1 and f"logged under {left[0]} (kept)" in err and "say-0-stdout" not in out
    assert "say-0-stdout" in next(left[0].rglob("stdout.log")).read_text()


def test_sigterm_handler_gets_torchruns_30s_grace(tmp_path: Path) -> None:
    """A worker checkpointing 6 s after SIGTERM (longer than the old 5 s default) finishes it."""
    ready, saved = tmp_path / "ready", tmp_path / "saved"
    proc = start(
        "--nproc-per-node",
        "1",
        WORKER,
        "--checkpoint-on-sigterm",
        "6",
        str(saved),
        "--ready-file",
        str(ready),
    )
    wait_files([ready], proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err
    assert saved.read_text() == "saved"


def test_shutdown_timeout_variable_sets_the_grace_period(tmp_path: Path) -> None:
    ready, saved = tmp_path / "ready", tmp_path / "saved"
    args = ["--nproc-per-node", "1", WORKER, "--checkpoint-on-sigterm", "30", str(saved), "--ready-file", str(ready)]
    proc = start(*args, env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "0"})
    wait_files([ready], proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)  # SIGKILLed at once: well before the handler's 30 s
    assert code == 128 + signal.SIGTERM, err
    assert not saved.exists()


def test_sigkilled_worker_output_without_newline_is_in_console_and_log(tmp_path: Path) -> None:
    proc = start(
        "--nproc-per-node",
        "1",
        "--log-dir",
        str(tmp_path),
        "--run-id",
        "k",
        WORKER,
        "--partial-then-sigkill",
        "last words",
    )
    code, out, err = finish(proc)
    assert code == 128 + signal.SIGKILL, err
    assert "[rank 0] last words\n" in out
    assert (tmp_path / "k" / "attempt-0" / "rank-0" / "stdout.log").read_text() == "last words"


def test_progress_redrawn_with_carriage_return_reaches_the_console_while_running(tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    proc = start("--nproc-per-node", "1", WORKER, "--redraw-until", str(stop))
    assert proc.stdout is not None
    seen = ""

    def progressed() -> bool:
        nonlocal seen
        assert proc.stdout is not None
        if select.select([proc.stdout], [], [], 0.1)[0]:
            seen += os.read(proc.stdout.fileno(), 4096).decode()
        return "step 2" in seen  # shown before any newline was written

    wait_for(progressed, lambda: f"no progress on the console: {seen!r}", poll_s=0)
    stop.touch()
    code, out, err = finish(proc)
    assert code == 0, err
    assert "\r[rank 0] step " in seen


def test_parent_error_file_gets_the_root_cause_and_log_dir_keeps_the_workers(tmp_path: Path) -> None:
    parent = tmp_path / "parent-error.json"
    logs = tmp_path / "logs"
    proc = start(
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(logs),
        "--run-id",
        "e",
        "--no-python",
        sys.executable,
        "tests/fake_worker.py",
        "--only-rank",
        "1",
        "--error-file",
        "--sleep",
        "30",
        env={"TORCHELASTIC_ERROR_FILE": str(parent)},
    )
    code, _, err = finish(proc)
    assert code != 0
    data = json.loads(parent.read_text())
    assert data["message"]["errorCode"] == code
    worker_file = logs / "e" / "errors" / "attempt-0" / "rank-1" / "error.json"
    assert worker_file.exists() and f"error file {worker_file}" in err


def test_without_log_dir_the_summary_names_no_deleted_file(tmp_path: Path) -> None:
    parent = tmp_path / "parent-error.json"
    args = ["--nproc-per-node", "1", "--no-python", sys.executable, "tests/fake_worker.py", "--exit", "3"]
    code, _, err = finish(start(*args, env={"TORCHELASTIC_ERROR_FILE": str(parent)}))
    assert code == 3 and "root cause: rank 0" in err
    assert "error.json" not in err
    message = json.loads(parent.read_text())["message"]
    assert (
        message["message"].startswith("ChildFailedError")
        and "exited with code 3" in message["extraInfo"]["py_callstack"]
    )


# Every PET_* variable torchrun reads, set alone on a one-node job (with what it needs to take
# effect under torchrun: on one node torchrun ignores a run id and master address unless a port or
# endpoint is given), as (variables, launcher arguments, worker variables both launchers must
# give). "{port}" is a free port, "{dump}" the launcher's output directory.
_DUMP = ["tests/compat_worker.py", "--dump", "{dump}"]
_TWO = ["--nproc-per-node=2", *_DUMP]
_PORT = {"PET_MASTER_PORT": "{port}"}
PET_CASES: dict[str, tuple[dict[str, str], list[str], dict[str, str]]] = {
    "PET_NPROC_PER_NODE": ({"PET_NPROC_PER_NODE": "2"}, _DUMP, {"WORLD_SIZE": "2"}),
    "PET_NNODES": ({"PET_NNODES": "1"}, _TWO, {"GROUP_WORLD_SIZE": "1"}),
    "PET_NODE_RANK": ({"PET_NODE_RANK": "0"}, _TWO, {"GROUP_RANK": "0"}),
    "PET_RDZV_BACKEND": ({"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "localhost:{port}"}, _TWO, {}),
    "PET_RDZV_ENDPOINT": ({"PET_RDZV_ENDPOINT": "127.0.0.1:{port}"}, _TWO, {"MASTER_PORT": "{port}"}),
    "PET_RDZV_ID": ({"PET_RDZV_ID": "pet-id", **_PORT}, _TWO, {"TORCHELASTIC_RUN_ID": "pet-id"}),
    "PET_RDZV_CONF": ({"PET_RDZV_CONF": "join_timeout=60"}, _TWO, {}),
    "PET_STANDALONE": ({"PET_STANDALONE": "1"}, _TWO, {}),
    "PET_MAX_RESTARTS": ({"PET_MAX_RESTARTS": "3"}, _TWO, {"TORCHELASTIC_MAX_RESTARTS": "3"}),
    "PET_MONITOR_INTERVAL": ({"PET_MONITOR_INTERVAL": "0.5"}, _TWO, {}),
    "PET_START_METHOD": ({"PET_START_METHOD": "fork"}, _TWO, {}),
    "PET_EVENT_LOG_HANDLER": ({"PET_EVENT_LOG_HANDLER": "null"}, _TWO, {}),
    "PET_ROLE": ({"PET_ROLE": "trainer"}, _TWO, {"ROLE_NAME": "trainer"}),
    "PET_MODULE": ({"PET_MODULE": "1"}, ["--nproc-per-node=2", "compat_worker", "--dump", "{dump}"], {}),
    "PET_NO_PYTHON": ({"PET_NO_PYTHON": "1"}, ["--nproc-per-node=2", sys.executable, *_DUMP], {}),
    "PET_RUN_PATH": ({"PET_RUN_PATH": "1"}, _TWO, {}),
    "PET_LOG_DIR": ({"PET_LOG_DIR": "{dump}/logs"}, _TWO, {}),
    "PET_REDIRECTS": ({"PET_REDIRECTS": "1"}, _TWO, {}),
    "PET_TEE": ({"PET_TEE": "2"}, _TWO, {}),
    "PET_LOCAL_RANKS_FILTER": ({"PET_LOCAL_RANKS_FILTER": "0"}, _TWO, {}),
    "PET_DUPLICATE_STDOUT_FILTERS": ({"PET_DUPLICATE_STDOUT_FILTERS": ""}, _TWO, {}),
    "PET_DUPLICATE_STDERR_FILTERS": ({"PET_DUPLICATE_STDERR_FILTERS": ""}, _TWO, {}),
    "PET_MASTER_ADDR": ({"PET_MASTER_ADDR": "127.0.0.1", **_PORT}, _TWO, {"MASTER_ADDR": "127.0.0.1"}),
    "PET_MASTER_PORT": (_PORT, _TWO, {"MASTER_PORT": "{port}"}),
    "PET_LOCAL_ADDR": ({"PET_LOCAL_ADDR": "127.0.0.1"}, _TWO, {}),
    "PET_SIGNALS_TO_HANDLE": (
        {"PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT"},
        _TWO,
        {"TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT"},
    ),
    "PET_SHUTDOWN_TIMEOUT": ({"PET_SHUTDOWN_TIMEOUT": "10"}, _TWO, {}),
    "PET_VIRTUAL_LOCAL_RANK": ({"PET_VIRTUAL_LOCAL_RANK": "1"}, _TWO, {"LOCAL_RANK": "0"}),
}


def test_every_pet_variable_has_a_case() -> None:
    from openclaw_launch.cli.torchrun_compat import FLAGS

    assert set(PET_CASES) == {name for flag in FLAGS for name in flag.env if name.startswith("PET_")}


@pytest.mark.parametrize(("variable", "side"), case_sides(PET_CASES, live_every_run=["PET_NPROC_PER_NODE"]))
def test_each_pet_variable_gives_the_workers_of_torchrun(tmp_path: Path, variable: str, side: str) -> None:
    """Both launchers with the variable set: the same exit code, ranks, rank variables and argv
    (tests/test_torchrun_compat.py's comparison), and the values the variable asks for."""
    from test_torchrun_compat import assert_same, compared

    env, args, expected = PET_CASES[variable]
    theirs, run = compared(f"pet/{variable}", side, args, env, tmp_path)
    ours = run.observed()
    assert_same(variable, theirs, ours)
    for which, observed in (("torchrun", theirs), ("openclaw", ours)):
        for rank, got in observed["ranks"].items():
            assert {k: got.get(k) for k in expected} == expected, f"{which} rank {rank}"
    if variable == "PET_LOG_DIR":  # both wrote their workers' logs there
        assert "logs" in theirs["files"] and "logs" in ours["files"]
