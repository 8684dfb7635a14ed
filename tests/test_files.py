"""write_atomic: whole file or old file, never a temp file left behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from openclaw_launch.files import write_atomic


def test_writes_whole_file_and_makes_parents(tmp_path: Path) -> None:
    target = tmp_path / "logs" / "job7" / "report.json"
    write_atomic(target, "one\n")
    write_atomic(target, "two\n")
    assert target.read_text() == "two\n"
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


def test_failed_replace_leaves_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.mkdir()  # a directory where the file should go: the rename fails
    with pytest.raises(OSError):
        write_atomic(target, "new\n")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"] and target.is_dir()
