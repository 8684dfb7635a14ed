"""The run directory is the launcher's, not the workers' (issue 32, items 3 and 4): a file a worker
controls (its stack file, its ``@record`` error file) is read by safe_read.read_untrusted, so a FIFO,
a symlink, a huge or deep or non-UTF-8 file there neither blocks the launcher nor crashes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.safe_read import parse_json, read_untrusted
from openclaw_launch.stats.hang import HANG_EXIT_CODE

ROOT = str(Path(__file__).resolve().parents[1])

#: Every rank steps, then swaps its stack file for a FIFO (a blocking open of it never returns) and hangs.
FIFO_WORKER = """
import os, time
from openclaw_launch import telemetry
for _ in range(3):
    telemetry.step()
    time.sleep(0.05)
stacks = os.environ["OPENCLAW_STACKS_FILE"]
os.unlink(stacks)
os.mkfifo(stacks)
print("HANGING", flush=True)
while True:
    time.sleep(1)
"""

#: Every rank writes its error file from argv[1] (a name of BAD_ERROR_FILES) and exits 1.
ERROR_FILE_WORKER = """
import os, sys
bad = {"deep": b"[" * 60000, "binary": b'{"message": "\\xff\\xfe not utf-8"}'}
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "wb") as f:
    f.write(bad[sys.argv[1]])
sys.exit(1)
"""


def _launch(
    tmp_path: Path, script: str, launcher_args: list[str], worker_args: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    worker = tmp_path / "worker.py"
    worker.write_text(script)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "openclaw_launch",
            "--nproc-per-node",
            "2",
            "--report",
            str(tmp_path / "report.json"),
            "--grace-period-s",
            "3",
            *launcher_args,
            str(worker),
            *worker_args,
        ],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", **env},
    )


def test_a_stack_file_swapped_for_a_fifo_does_not_wedge_the_hang_verdict(tmp_path: Path) -> None:
    done = _launch(tmp_path, FIFO_WORKER, ["--hang-timeout-s", "2"], [], {})
    assert done.returncode == HANG_EXIT_CODE, done.stderr
    assert "openclaw-launch: hang: no step for" in done.stderr
    assert "(a worker's file)" in done.stderr and "Traceback" not in done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == HANG_EXIT_CODE


@pytest.mark.parametrize("bad", ["deep", "binary"])
def test_a_deep_or_non_utf8_error_file_gives_the_workers_exit_and_a_report(tmp_path: Path, bad: str) -> None:
    parent = tmp_path / "parent-error.json"
    done = _launch(tmp_path, ERROR_FILE_WORKER, [], [bad], {"TORCHELASTIC_ERROR_FILE": str(parent)})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["exit_code"] == 1
    assert "message" in json.loads(parent.read_text())


def test_read_untrusted_refuses_what_is_not_a_regular_file_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    fifo, link, directory = tmp_path / "fifo", tmp_path / "link", tmp_path / "dir"
    os.mkfifo(fifo)
    directory.mkdir()
    (tmp_path / "target").write_text("secret")
    link.symlink_to(tmp_path / "target")
    for path in (fifo, link, directory):
        assert read_untrusted(path, 1024, said.append) is None
    assert len(said) == 3 and all(str(p) in s for p, s in zip((fifo, link, directory), said, strict=True))
    assert read_untrusted(tmp_path / "missing", 1024, said.append) is None and len(said) == 3


def test_read_untrusted_bounds_the_size_and_replaces_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    big, binary = tmp_path / "big", tmp_path / "binary"
    big.write_bytes(b"x" * (8 << 10))
    binary.write_bytes(b"ok \xff\xfe end")
    text = read_untrusted(big, 2 << 10)
    assert text is not None and text.startswith("x" * (2 << 10)) and "cut at 2 KiB" in text
    assert len(text) < (3 << 10)
    assert read_untrusted(binary, 1024) == "ok \ufffd\ufffd end"


def test_deep_nesting_is_malformed_json_not_a_recursion_error() -> None:
    with pytest.raises(ValueError, match="nests deeper"):
        parse_json("[" * 60000)
