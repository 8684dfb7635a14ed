"""The statistics helper process (stats/helper.py): NVML samples (replayed from a recording of the
2x H200 host: NVML is the absent hardware), the metrics endpoint and the stats file run in a forked
helper, and their numbers reach the session over its link."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from guards import GUARD_S, wait_for

from openclaw_launch.codec import from_json, to_json
from openclaw_launch.errors import LaunchError
from openclaw_launch.stats.gpu import RecordedSource, SampleSource
from openclaw_launch.stats.result import SessionResult
from openclaw_launch.stats.session import StatsSession

SAMPLES = Path(__file__).parent / "data" / "nvml-samples-h200x2.json"
UUIDS = sorted(json.loads(SAMPLES.read_text())["samples"])


@dataclass(frozen=True)
class _Rank:
    rank: int
    local_rank: int
    gpu_uuid: str | None
    node: str = "n0"


@dataclass(frozen=True)
class _RunDir:
    """What the session reads of the run directory: the statistics channel's token."""

    token: str


@dataclass(frozen=True)
class _Plan:
    """What the session reads of a plan."""

    ranks: tuple[_Rank, ...] = field(default_factory=lambda: tuple(_Rank(i, i, u) for i, u in enumerate(UUIDS)))
    run_id: str = "helper-test"
    node: str = "n0"
    world_size: int = len(UUIDS)
    parallel: None = None  # no TP/PP/DP layout: the waits' groups are named by their ranks
    run_dir: _RunDir = field(default_factory=lambda: _RunDir("test-token"))


def _session(tmp: Path, said: list[str], **kw: Any) -> StatsSession:
    sock = f"@oc-test-{os.getpid()}-{time.monotonic_ns()}"  # abstract, as the launcher's: no file left
    return StatsSession(cast(Any, _Plan()), sock, 5.0, said.append, **kw)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_samples_metrics_and_stats_file_come_from_the_helper(tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.jsonl"
    said: list[str] = []

    def recorded(uuids: list[str]) -> SampleSource:
        return RecordedSource.load(SAMPLES)

    session = _session(tmp_path, said, gpu_source=recorded, metrics_port=0, stats_file=str(stats_file))
    helper = session.helper
    assert helper is not None and helper.pid != os.getpid() and session.metrics_port

    def sampled() -> bool:
        helper.drain()
        return set(helper.latest) == set(UUIDS)

    wait_for(sampled, "no samples over the link")
    assert helper.latest[UUIDS[0]]["sm_clock_mhz"] == 1980.0

    session.publish()
    url = f"http://127.0.0.1:{session.metrics_port}/metrics"

    def served() -> bool:
        return "openclaw_gpu_power_w" in urllib.request.urlopen(url, timeout=GUARD_S).read().decode()

    wait_for(served, "the endpoint never served the GPU numbers")
    session.live_line()  # a stats-file line
    result = session.finish({})
    lines = [json.loads(line) for line in stats_file.read_text().splitlines()]
    assert len(lines) == 2 and set(lines[-1]["gpus"]) == set(UUIDS)  # the interval's line and the final one
    assert [r["gpu_uuid"] for r in lines[-1]["ranks"]] == UUIDS
    assert result.statistics.gpu_error is None and all(result.gpus[u].samples >= 1 for u in UUIDS)
    assert result.gpus[UUIDS[0]].sm_clock_mhz_min == 1980.0
    assert from_json(SessionResult, json.loads(json.dumps(to_json(result)))) == result  # typed, in the one codec
    assert not _alive(helper.pid) and said == []
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=GUARD_S)  # the endpoint went with the helper


def test_nvml_that_does_not_start_is_a_warning_and_in_the_report(tmp_path: Path) -> None:
    said: list[str] = []

    def broken(uuids: list[str]) -> SampleSource:
        raise RuntimeError("NVML Shared Library Not Found")

    session = _session(tmp_path, said, gpu_source=broken)
    helper = session.helper
    assert helper is not None

    def warned() -> bool:
        helper.drain()
        return bool(said)

    wait_for(warned, "no warning from the helper")
    assert said == ["openclaw-launch: warning: GPU sampling off: NVML Shared Library Not Found"]
    result = session.finish({})
    assert result.statistics.gpu_error == "GPU sampling off: NVML Shared Library Not Found" and result.gpus == {}


def test_no_gpus_no_metrics_no_file_no_helper(tmp_path: Path) -> None:
    session = _session(tmp_path, [], gpu_source=None)
    assert session.helper is None
    session.close()


def test_a_busy_metrics_port_is_an_error_before_any_helper(tmp_path: Path) -> None:
    with socket.create_server(("0.0.0.0", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"--metrics-port {port}: cannot listen"):
            _session(tmp_path, [], metrics_port=port)
