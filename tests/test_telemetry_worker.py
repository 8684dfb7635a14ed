"""Worker side of the statistics: the recorder, the API, the bootstrap. Real sockets, real processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S
from host import needs_torch

from openclaw_launch.telemetry import recorder, wire, wire_check

HERE = Path(__file__).parent
PROBE = HERE / "telemetry_workers" / "argv_probe.py"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def inbox(tmp_path: Path):  # type: ignore[no-untyped-def]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "t.sock")
    sock.bind(path)
    sock.settimeout(GUARD_S)
    yield path, sock
    sock.close()


def test_phases_are_exclusive_and_add_up_to_at_most_the_step(inbox) -> None:  # type: ignore[no-untyped-def]
    path, sock = inbox
    clock = FakeClock()
    rec = recorder.Recorder(path, rank=3, clock=clock)
    rec.step("api")  # the end of a first step (no phase: it ran since the recorder was made)
    rec.enter("input")
    clock.now += 0.010
    rec.enter("forward")  # nested: input pauses
    clock.now += 0.004
    rec.leave()
    clock.now += 0.001
    rec.leave()
    clock.now += 0.005  # unclaimed: "other"
    rec.step("api")
    rec.step("optimizer")  # the API owns the step boundary: ignored
    rec.close()
    batch = wire_check.decode(sock.recv(65536))
    assert batch is not None and batch.rank == 3 and batch.final and batch.step_source == "api"
    [(first_s, first), (step_s, phases)] = batch.steps
    assert (first_s, first) == (0.0, {})
    assert step_s == pytest.approx(0.020)
    assert phases == pytest.approx({"input": 0.011, "forward": 0.004})


def test_a_phase_across_a_step_boundary_is_split(inbox) -> None:  # type: ignore[no-untyped-def]
    path, sock = inbox
    clock = FakeClock()
    rec = recorder.Recorder(path, rank=0, clock=clock)
    rec.step("api")
    rec.enter("compute")
    clock.now += 0.003
    rec.step("api")
    clock.now += 0.002
    rec.leave()
    rec.step("api")
    rec.close()
    batch = wire_check.decode(sock.recv(65536))
    assert batch is not None
    assert [p for _, p in batch.steps[1:]] == [pytest.approx({"compute": 0.003}), pytest.approx({"compute": 0.002})]


def test_the_flush_interval_follows_the_stats_interval() -> None:
    """A quarter of the live interval, 0.5 s at most (the default cadence keeps it), 0.05 s at least;
    the worker takes only what the plan could have set, else 0.5 s."""
    assert [wire.flush_interval_s(s) for s in (None, 0, 10.0, 2.0, 1.0, 0.5, 0.1, 0.01)] == [
        0.5, 0.5, 0.5, 0.5, 0.25, 0.125, 0.05, 0.05
    ]  # fmt: skip
    assert [wire.flush_interval_from_env(v) for v in (None, "", "x", "0", "-1", "nan", "inf", "5")] == [0.5] * 8
    planned = str(wire.flush_interval_s(0.5))  # as the plan writes it
    assert wire.flush_interval_from_env("0.125") == 0.125 == wire.flush_interval_from_env(planned)


@pytest.mark.parametrize(("env_value", "steps_per_batch"), [("0.125", [1] * 9), (None, [3, 3, 3]), ("bad", [3, 3, 3])])
def test_the_recorder_flushes_as_often_as_its_environment_says(  # type: ignore[no-untyped-def]
    inbox, monkeypatch: pytest.MonkeyPatch, env_value: str | None, steps_per_batch: list[int]
) -> None:
    """Steps 0.2 s apart on a fake clock: with the 0.5 s interval's flush (0.125 s) every step goes out
    at once; by default (or with a bad value) a batch goes out every 0.6 s, three steps at a time."""
    path, sock = inbox
    if env_value is None:
        monkeypatch.delenv(wire.FLUSH_ENV, raising=False)
    else:
        monkeypatch.setenv(wire.FLUSH_ENV, env_value)
    clock = FakeClock()
    rec = recorder.Recorder(path, rank=0, clock=clock)
    for k in range(1, 10):
        clock.now = k * 0.2
        rec.step("api")
    sock.setblocking(False)
    sizes = []
    while True:
        try:
            batch = wire_check.decode(sock.recv(65536))
        except BlockingIOError:
            break
        assert batch is not None
        sizes.append(len(batch.steps))
    rec.close()
    assert sizes == steps_per_batch


def test_a_gone_launcher_costs_nothing(tmp_path: Path) -> None:
    rec = recorder.Recorder(str(tmp_path / "nobody.sock"), rank=0)
    for _ in range(3):
        rec.step("api")
    rec.flush()
    rec.close()  # no exception, nothing blocks


def test_bad_datagrams_decode_to_none() -> None:
    for data in (b"", b"garbage", b"[]", json.dumps({"v": 99}).encode(), json.dumps({"v": 1, "rank": "x"}).encode()):
        assert wire_check.decode(data) is None
    batch = wire.Batch(rank=1, steps=[(0.5, {"input": 0.1})], gpu_sync_s=0.2, gpu_collectives=4)
    assert wire_check.decode(wire.encode(batch)) == batch


def test_api_is_a_no_op_without_the_launcher_and_cheap_to_import() -> None:
    code = (
        "import sys; from openclaw_launch import telemetry\n"
        "assert not {'torch', 'socket', 'json', 'click'} & set(sys.modules), sorted(sys.modules)\n"
        "with telemetry.section('data'):\n    pass\n"
        "telemetry.step()\nprint('ok')"
    )
    env = {k: v for k, v in os.environ.items() if k != wire.SOCKET_ENV}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=GUARD_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _probe(
    *args: str, bootstrap: bool, env: dict[str, str] | None = None, cwd: Path | str = "/"
) -> subprocess.CompletedProcess[str]:
    front = ["-m", "openclaw_launch.telemetry.bootstrap"] if bootstrap else []
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), **(env or {})}
    return subprocess.run(
        [sys.executable, "-u", *front, *args], capture_output=True, text=True, timeout=GUARD_S, env=env, cwd=cwd
    )


def test_bootstrap_leaves_argv_path_and_main_as_python_does(tmp_path: Path) -> None:
    env = {**os.environ, wire.SOCKET_ENV: str(tmp_path / "t.sock")}
    plain = _probe(str(PROBE), "--lr", "0.1", bootstrap=False)
    ours = _probe(str(PROBE), "--lr", "0.1", bootstrap=True, env=env)
    assert plain.returncode == ours.returncode == 0, ours.stderr
    seen_plain, seen_ours = json.loads(plain.stdout), json.loads(ours.stdout)
    assert seen_ours == seen_plain
    assert seen_ours["argv"] == [str(PROBE), "--lr", "0.1"] and seen_ours["name"] == "__main__"
    assert not seen_ours["torch"]  # a script that never imports torch never pays for it


@pytest.mark.parametrize("how", ["symlinked-script", "symlinked-directory", "relative-path", "safe-path"])
def test_bootstrap_gives_a_script_what_plain_python_gives_it(tmp_path: Path, how: str) -> None:
    """sys.path[0] is the directory of the script's real path (python's realpath, not abspath),
    __file__ the absolute path as given, sys.argv untouched; -P leaves sys.path alone."""
    real, links = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    (real / "probe.py").write_text(PROBE.read_text())
    (links / "train.py").symlink_to("../real/probe.py")
    (tmp_path / "linked-dir").symlink_to(real)
    script = {
        "symlinked-script": "links/train.py",
        "symlinked-directory": "linked-dir/probe.py",
        "relative-path": "real/probe.py",
        "safe-path": "links/train.py",
    }[how]
    env = {"PYTHONSAFEPATH": "1"} if how == "safe-path" else {}
    plain = _probe(script, "--lr", "0.1", bootstrap=False, env=env, cwd=tmp_path)
    ours = _probe(script, "--lr", "0.1", bootstrap=True, env=env, cwd=tmp_path)
    assert plain.returncode == ours.returncode == 0, ours.stderr
    seen_plain, seen_ours = json.loads(plain.stdout), json.loads(ours.stdout)
    assert seen_ours == seen_plain
    assert seen_ours["argv"] == [script, "--lr", "0.1"] and seen_ours["file"] == str(tmp_path / script)
    # under PYTHONSAFEPATH sys.path starts with PYTHONPATH (here the repository), for both
    assert seen_ours["path0"] == (str(HERE.parent) if how == "safe-path" else str(real))


def test_bootstrap_passes_exit_codes_and_python_errors(tmp_path: Path) -> None:
    assert _probe(str(PROBE), "7", bootstrap=True).returncode == 7
    missing_plain = _probe(str(tmp_path / "nope.py"), bootstrap=False)
    missing_ours = _probe(str(tmp_path / "nope.py"), bootstrap=True)
    assert missing_plain.returncode == missing_ours.returncode == 2
    assert "can't open file" in missing_ours.stderr and "Traceback" not in missing_ours.stderr


def test_bootstrap_runs_modules_like_python_dash_m() -> None:
    ours = _probe("-m", "platform", bootstrap=True)
    assert ours.returncode == 0 and ours.stdout == _probe("-m", "platform", bootstrap=False).stdout


def test_flight_recorder_entries_are_attributed_to_their_steps() -> None:
    """Entries shaped as torch 2.13's flight recorder dumps them (see the H200 notes)."""
    import pickle
    import time

    from openclaw_launch.telemetry.flight_recorder import FlightRecorder

    now = time.time_ns()
    windows = [(now - 3_000_000_000, now - 2_900_000_000), (now - 2_900_000_000, now - 2_800_000_000)]

    def entry(record_id: int, created: int, ms: float | None, state: str = "completed") -> dict[str, object]:
        return {
            "record_id": record_id,
            "profiling_name": "nccl:all_reduce",
            "time_created_ns": created,
            "duration_ms": ms,
            "state": state,
        }

    entries = [
        entry(0, windows[0][0] - 5, 9.0),  # before the first known step: not counted
        entry(1, windows[0][0] + 10, 30.0),
        entry(2, windows[0][0] + 20, 2.0),
        entry(3, windows[1][0] + 10, 1.0),
        entry(4, now, None, "started"),  # still running: stops this read
    ]
    reader = FlightRecorder(lambda **_: pickle.dumps({"entries": entries}))
    read = reader.read(windows)
    assert read is not None and read.steps == 2 and read.collectives == 3
    assert read.sync_s == pytest.approx(0.033) and read.late_s == pytest.approx(0.031)
    assert reader.read(windows) is None  # read again only after READ_INTERVAL_S


FAILING = 'import sys\n\n\ndef step(batch):\n    raise ValueError(f"bad batch {batch}")\n\n\nstep(int(sys.argv[1]))\n'


@pytest.mark.parametrize("how", ["script", "symlinked-script", "module", "directory"])
def test_a_failing_script_under_the_launcher_prints_plain_pythons_traceback(tmp_path: Path, how: str) -> None:
    """stderr (less the rank prefix) line for line and the exit code as ``python SCRIPT``: no
    launcher frame in the traceback; under ``-m`` and for a directory runpy's frames as python's."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "failing.py").write_text(FAILING)
    (tmp_path / "train.py").symlink_to("pkg/failing.py")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(FAILING)
    target = {
        "script": ["pkg/failing.py"],
        "symlinked-script": ["train.py"],
        "module": ["-m", "pkg.failing"],
        "directory": ["app"],
    }[how]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    plain = subprocess.run(
        [sys.executable, *target, "3"], capture_output=True, text=True, timeout=GUARD_S, env=env, cwd=tmp_path
    )
    ours = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "1", *target, "3"],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env=env,
        cwd=tmp_path,
    )
    assert plain.returncode == ours.returncode == 1, ours.stderr
    ranks = [line.removeprefix("[rank 0] ") for line in ours.stderr.splitlines() if line.startswith("[rank 0] ")]
    assert ranks == plain.stderr.splitlines()
    assert "ValueError: bad batch 3" in plain.stderr and "bootstrap" not in ours.stderr


def test_a_missing_module_fails_in_python_dash_ms_words(tmp_path: Path) -> None:
    plain = _probe("-m", "no_such_module_here", bootstrap=False)
    ours = _probe("-m", "no_such_module_here", bootstrap=True)
    assert plain.returncode == ours.returncode == 1
    assert ours.stderr == plain.stderr


def test_a_keyboard_interrupt_ends_the_script_by_sigint_as_in_python(tmp_path: Path) -> None:
    script = tmp_path / "interrupted.py"
    script.write_text("raise KeyboardInterrupt\n")
    plain, ours = _probe(str(script), bootstrap=False), _probe(str(script), bootstrap=True)
    assert plain.returncode == ours.returncode == -signal.SIGINT
    assert ours.stderr == plain.stderr


@needs_torch
def test_the_error_file_of_record_holds_the_same_traceback_as_under_plain_python(tmp_path: Path) -> None:
    """torch's ``@record`` formats the traceback inside its own wrapper: no launcher frame there."""
    script = tmp_path / "recorded.py"
    script.write_text(
        "from torch.distributed.elastic.multiprocessing.errors import record\n\n\n"
        "@record\ndef main():\n    raise ValueError('bad batch')\n\n\nmain()\n"
    )
    seen = []
    for bootstrap in (False, True):
        error_file = tmp_path / f"error-{bootstrap}.json"
        done = _probe(str(script), bootstrap=bootstrap, env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
        assert done.returncode == 1, done.stderr
        seen.append(json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"])
    assert seen[0] == seen[1] and "bad batch" in seen[0]


def test_a_scripts_own_excepthook_gets_what_plain_python_gives_it(tmp_path: Path) -> None:
    script = tmp_path / "hooked.py"
    script.write_text(
        "import sys, traceback\n\n\ndef hook(kind, exc, tb):\n"
        "    print('hook', kind.__name__, sys.exc_info()[0], len(traceback.extract_tb(tb)), file=sys.stderr)\n\n\n"
        "sys.excepthook = hook\nraise ValueError('bad batch')\n"
    )
    plain, ours = _probe(str(script), bootstrap=False), _probe(str(script), bootstrap=True)
    assert plain.returncode == ours.returncode == 1
    assert ours.stderr == plain.stderr == "hook ValueError None 1\n"
