"""``openclaw-launch compare BASE.json NEW.json``: recorded reports of one job (2 CPU ranks of
examples/train.py, then the same with rank 1's DataLoader 5 ms slower), GPU facts that differ, and
reports that cannot be compared (exit 2, one line; in this process: tests/cli_runner.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from cli_runner import invoke

from openclaw_launch.report.build import write_report
from openclaw_launch.report.compare import compare_reports
from openclaw_launch.report.model import NodeReport
from tests.report_samples import node_report, rank_entry, step_statistics

DATA = Path(__file__).resolve().parent / "data" / "reports"
BASE, SLOW = DATA / "train-2cpu-gloo.json", DATA / "train-2cpu-gloo-rank1-input.json"


def compare(*paths: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "compare", *map(str, paths)], capture_output=True, text=True
    )


def test_a_slower_run_is_explained_by_the_rank_and_phase_that_grew() -> None:
    proc = compare(BASE, SLOW)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("step time: ") and "ms/step (+" in lines[1]
    assert lines[2].startswith("explained by: rank 1, its input/host stage (input) +")
    assert "straggler: base none; new rank 1 (input, input)" in proc.stdout
    back = compare(SLOW, BASE)  # and the other way round: faster, by the same phase shrinking
    assert back.returncode == 0 and "explained by: rank 1, its input/host stage (input) -" in back.stdout


def test_gpu_clocks_and_throttle_reasons_that_differ_are_named() -> None:
    def report(clock_mhz: float, reasons: tuple[str, ...], compute_ms: float) -> NodeReport:
        ranks = []
        for rank in (0, 1):
            entry = rank_entry(rank, "n0", step_statistics(work_ms=compute_ms if rank == 1 else 8.0))
            assert entry.gpu is not None
            gpu = entry.gpu if rank == 0 else dataclasses.replace(entry.gpu, sm_clock_mhz_mean=clock_mhz)
            ranks.append(dataclasses.replace(entry, gpu=dataclasses.replace(gpu, clock_event_reasons=reasons)))
        return node_report("n0", world_size=2, ranks=tuple(ranks))

    lines = compare_reports(report(1980.0, (), 8.0), report(1718.0, ("sw_power_cap",), 12.0))
    assert "explained by: rank 1, compute +4.0 ms/step (8.0 -> 12.0 ms on rank 1)" in lines
    assert "gpu: rank 1: SM clock 1980 -> 1718 MHz" in lines
    assert "gpu: rank 0: throttle reasons now: sw_power_cap" in lines


def test_reports_of_different_jobs_or_unreadable_files_exit_2_in_one_line(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    ranks = tuple(rank_entry(r, "n0", step_statistics()) for r in range(4))
    write_report(other, node_report("n0", world_size=4, ranks=ranks))
    for args in ((BASE, other), (BASE, tmp_path / "missing.json"), (BASE, tmp_path)):
        proc = invoke("compare", *map(str, args))
        assert proc.returncode == 2 and proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    refused = invoke("compare", str(BASE), str(other))
    assert "not reports of the same job: world size 2 in BASE, 4 in NEW" in refused.stderr
