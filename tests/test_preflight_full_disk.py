"""Issue 32 item 9: ``preflight --exclude-file`` on a full disk kept the stale list of an earlier run
and exited 0. A disk already full is now found before anything is measured (files.check_output_path's
probe): exit 2 naming the option, and the stale list is not presented as this run's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (a private mount)"
)
def test_exclude_file_on_a_full_tmpfs_is_refused_before_measuring(tmp_path: Path) -> None:
    """A 4 KiB tmpfs holding an earlier run's list, then filled, mounted in a private mount namespace
    (gone with the command)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    listed = disk / "bad.txt"
    fill = f"echo stale01 > {listed} && head -c 65536 /dev/zero > {disk}/fill 2>/dev/null"  # full
    mount = f'mount -t tmpfs -o size=4k tmpfs {disk} && {{ {fill}; "$@"; echo "exit $? kept: $(cat {listed})"; }}'
    p = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh",
         sys.executable, "-m", "openclaw_launch", "preflight", "--nproc-per-node", "1", "--exclude-file", str(listed)],
        capture_output=True, text=True, timeout=GUARD_S,
    )  # fmt: skip
    assert "--exclude-file" in p.stderr and "No space left on device" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "[rank" not in p.stdout + p.stderr  # nothing was measured
    # exit 2: the earlier list is still there, but the command says it made none (no `&& sbatch`)
    assert p.stdout.strip().endswith("exit 2 kept: stale01"), p.stdout
