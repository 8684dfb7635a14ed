"""The exclude file (agents/exclude_file.py) and the report's exclusion record: one hostlist line
that ``sbatch --exclude`` takes, added to atomically, refused before the job when it cannot be
written; the record through the report's codec, ``report`` and ``compare``."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from openclaw_launch.agents.exclude_file import (
    REASONS_SUFFIX,
    ExcludeFileError,
    append_exclusion,
    check_exclude_file,
    read_exclude_file,
    write_exclude_file,
)
from openclaw_launch.codec import from_json, to_json
from openclaw_launch.report.compare import compare_reports
from openclaw_launch.report.format import format_report
from openclaw_launch.report.membership import GPU_MEMORY_HELD, Exclusion
from openclaw_launch.report.model import NodeReport
from tests.report_samples import EXCLUSION, node_report


def _exclusion(host: str, reason: str = "gpu-xid") -> Exclusion:
    return dataclasses.replace(EXCLUSION, node=host, host=host, reason=reason)


def test_appending_adds_to_the_hosts_there_as_one_hostlist_line_with_the_reasons_beside(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "exclude.txt"  # its directory is made
    assert append_exclusion(path, _exclusion("gpu07")) == "gpu07"
    assert append_exclusion(path, _exclusion("gpu08", GPU_MEMORY_HELD)) == "gpu[07-08]"
    assert append_exclusion(path, _exclusion("gpu07")) == "gpu[07-08]"  # once in the list
    assert path.read_text() == "gpu[07-08]\n"
    reasons = Path(str(path) + REASONS_SUFFIX).read_text().splitlines()
    assert [line.split("\t")[0] for line in reasons] == ["gpu07", "gpu08", "gpu07"]
    assert "gpu-memory-held" in reasons[1] and "2025-12-06T" in reasons[0]


def test_an_existing_list_stays_and_preflight_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / "exclude.txt"
    path.write_text("login,n[01-02]\n")  # an earlier job's, or written by hand
    assert check_exclude_file(path) is None
    assert append_exclusion(path, _exclusion("n03")) == "login,n[01-03]"
    assert read_exclude_file(path) == ["login", "n01", "n02", "n03"]
    assert write_exclude_file(path, []) == "" and path.read_text() == "\n"  # preflight: nothing to exclude
    assert read_exclude_file(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_text("n[01-\n"), "holds no Slurm hostlist"),
        (lambda p: (p.parent / "ro").mkdir(mode=0o500), "cannot create files"),
    ],
)
def test_a_path_that_cannot_be_the_exclude_file_is_named_before_the_job(tmp_path: Path, make, words: str) -> None:
    path = tmp_path / "exclude.txt"
    make(path)
    target = tmp_path / "ro" / "exclude.txt" if words == "cannot create files" else path
    if words == "cannot create files" and os.geteuid() == 0:
        pytest.skip("root writes to a read-only directory")
    problem = check_exclude_file(target)
    assert problem is not None and words in problem, problem
    if words == "holds no Slurm hostlist":
        with pytest.raises(ExcludeFileError):
            append_exclusion(path, _exclusion("n1"))


def test_a_device_takes_the_line_and_no_reasons(tmp_path: Path) -> None:
    assert check_exclude_file("/dev/null") is None
    assert append_exclusion("/dev/null", _exclusion("n1")) == "n1"


def test_the_record_round_trips_and_report_and_compare_show_it() -> None:
    measured = dataclasses.replace(EXCLUSION, reason="straggler", step_time_before_s=0.12, step_time_after_s=0.1)
    assert from_json(Exclusion, to_json(measured)) == measured
    report = node_report(exclusions=(EXCLUSION, measured))
    assert from_json(NodeReport, to_json(report)) == report
    text = format_report(report)
    assert "exclusion: node n1 (host gpu-a07) excluded after world 0: gpu-xid (NVML: XID 79 on GPU-5e1c)" in text
    assert "straggler (NVML: XID 79 on GPU-5e1c); step 120.0 -> 100.0 ms" in text
    lines = compare_reports(node_report(), report)
    assert "exclusions: base none; new n1 (gpu-xid, after world 0), n1 (straggler, after world 0)" in lines
    assert not any(line.startswith("exclusions") for line in compare_reports(node_report(), node_report()))
