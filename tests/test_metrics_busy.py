"""Per-rank busy share per interval (utilisation over time, issue 27): each stats-file line and the
Prometheus endpoint say, per rank, the share of its step time not spent waiting for peers over the
interval since the previous line (refresh), from the snapshot's running totals (stats/metrics.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from guards import GUARD_S
from host import needs_torch

from openclaw_launch.stats.metrics import BusyShare, MetricsServer, listen

ROOT = Path(__file__).resolve().parent.parent
VARIANCE = str(ROOT / "tests" / "telemetry_workers" / "variance_loop.py")


def _snap(*ranks: tuple[int, float | None, float | None]) -> dict[str, Any]:
    entries = []
    for rank, step, busy in ranks:
        entry: dict[str, Any] = {"rank": rank, "local_rank": rank, "gpu_uuid": None, "state": "running", "steps": 9}
        if step is not None:
            entry.update(step_total_s=step, busy_total_s=busy)
        entries.append(entry)
    return {"time": 0.0, "run_id": "r", "node": "n0", "restarts": 0, "ranks": entries, "gpus": {}}


def _shares(snap: dict[str, Any]) -> list[float | None]:
    return [r.get("busy_share") for r in snap["ranks"]]


def test_the_busy_share_is_the_intervals_not_the_runs() -> None:
    busy = BusyShare()
    assert _shares(busy.annotate(_snap((0, 1.0, 0.9), (1, None, None)))) == [0.9, None]  # rank 1: warming up
    assert _shares(busy.annotate(_snap((0, 3.0, 1.3), (1, 2.0, 1.0)))) == [0.2, 0.5]  # 0.4 of 2 s: 20 %
    assert _shares(busy.annotate(_snap((0, 3.0, 1.3), (1, 2.0, 1.0)))) == [None, None]  # no step since
    assert _shares(busy.annotate(_snap((0, 0.5, 0.4), (1, 2.5, 1.5)))) == [0.8, 1.0]  # rank 0 restarted


def test_the_endpoint_serves_the_busy_share_and_its_counters() -> None:
    sock = listen(0)
    port = sock.getsockname()[1]
    server = MetricsServer(sock)
    server.publish(_snap((0, 1.0, 0.5), (1, 1.0, 0.9)))
    server.publish(_snap((0, 3.0, 0.7), (1, 1.0, 0.9)))  # rank 1 made no step: its last share stays
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=GUARD_S).read().decode()
    labels = 'gpu_uuid="",local_rank="{r}",node="n0",rank="{r}",run_id="r"'
    assert f"openclaw_busy_share{{{labels.format(r=0)}}} 0.1" in text
    assert f"openclaw_busy_share{{{labels.format(r=1)}}} 0.9" in text
    assert f"openclaw_step_seconds_total{{{labels.format(r=0)}}} 3.0" in text
    assert f"openclaw_busy_seconds_total{{{labels.format(r=0)}}} 0.7" in text


@needs_torch
def test_the_stats_file_has_each_ranks_busy_share_per_interval(tmp_path: Path) -> None:
    """Rank 1's batches are always costlier: the others wait for it, its busy share is the higher."""
    stats_file = tmp_path / "stats.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "2", "--console-ranks", "none"]
        + ["--stats-interval-s", "0.5", "--stats-file", str(stats_file), VARIANCE, "--fixed-rank", "1"]
        + ["--steps", "60", "--costly-pct", "100"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in stats_file.read_text().splitlines()]
    both = [
        [r["busy_share"] for r in line["ranks"]]
        for line in lines
        if all(r.get("busy_share") is not None for r in line["ranks"])
    ]
    assert len(both) >= 2, lines  # a series, not one number
    assert all(0.0 <= s <= 1.0 for pair in both for s in pair)
    assert statistics.median(b - a for a, b in both) > 0.15, both  # rank 1: ~0.8 of its step, rank 0: ~0.5
