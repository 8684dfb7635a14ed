"""Waits per process group (issue 27): each wait in a collective or point-to-point call is booked to
its group, named from the plan's parallel layout where the launcher laid it out (``dp``/``tp``/
``pp``), else by a DeviceMesh dimension, the world, or its ranks; shown in the verdict's hint, the
report's ``statistics.waits_by_group`` and the exit summary. The end-to-end run is four real gloo
ranks with a script that has no openclaw code (tests/telemetry_workers/group_waits.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.plan.parallel import ParallelLayout
from openclaw_launch.stats.groups import namer, waits_text
from openclaw_launch.telemetry import wire, wire_check
from openclaw_launch.telemetry.groups import group_key, mesh_dim_of, ranks_text

WORKER = Path(__file__).resolve().parent / "telemetry_workers" / "group_waits.py"


def test_the_pipeline_groups_waits_are_named_pp_and_lead_the_hint(tmp_path: Path) -> None:
    """Stage 0's ranks work 20 ms longer per step: stage 1's ranks wait for them in the pipeline
    group's all-reduce; the data-parallel groups and the world wait little (two cores, four ranks)."""
    report = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "4", "--pp", "2", "--report", str(report)]
        + ["--console-ranks", "none", str(WORKER), "--steps", "30"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(report.read_text())
    waits = saved["statistics"]["waits_by_group"]
    assert set(waits) == {"pp", "dp", "world"}, waits
    assert waits["pp"] > 0.2 and waits["pp"] > max(waits["dp"], waits["world"]), waits
    [straggler] = saved["stragglers"]
    assert straggler["rank"] in (0, 1)  # stage 0's ranks are both slow
    assert any(h.startswith("waits: the other ranks wait in pp ") for h in straggler["hints"]), straggler["hints"]
    assert "waits by process group (the median rank's share of its step): pp " in proc.stderr  # the exit summary


def test_groups_are_named_by_the_plan_then_the_mesh_then_the_world_then_their_ranks() -> None:
    layout = ParallelLayout(tp=2, pp=2, dp=2, order=tuple(range(8)), nvlinked=None)  # [pp][dp][tp]
    name = namer(layout, 8)
    assert [name(group_key(g)) for g in ([0, 1], [0, 2], [1, 5], [4, 6])] == ["tp", "dp", "pp", "dp"]
    assert name(group_key(range(8))) == "world"
    assert name(group_key([0, 3], "dp_shard")) == "dp_shard"  # a DeviceMesh dimension the plan did not lay out
    assert name(group_key([0, 3])) == "ranks 0,3"
    # torch's groups: a DeviceMesh dimension's, an unnamed 1-D mesh's (FSDP2 without a mesh), the default group
    assert [mesh_dim_of(d) for d in ("mesh_dp_shard", "mesh_default", "default_pg")] == ["dp_shard", "", ""]
    alone = namer(None, 4)  # no layout: the world and the ranks
    assert alone(group_key([3, 2, 1, 0])) == "world" and alone(group_key([0, 2])) == "ranks 0,2"
    dp_only = namer(ParallelLayout(tp=1, pp=1, dp=4, order=(0, 1, 2, 3), nvlinked=None), 4)
    assert dp_only(group_key(range(4))) == "dp"  # the world is the one data-parallel group


def test_large_groups_are_keyed_short_and_stay_apart() -> None:
    assert ranks_text(range(0, 128, 2)) == "0-126/2"
    uneven = [*range(40), 99]
    assert ranks_text(uneven).startswith("0..99#41#") and ranks_text(uneven) != ranks_text([*range(39), 98, 99])
    assert len(group_key(range(8192))) < wire_check.MAX_NAME_CHARS


def test_the_waits_line_shows_the_longest_groups_above_half_a_percent() -> None:
    shares = {"pp": 0.4, "dp": 0.05, "world": 0.004, "tp": 0.1}
    assert waits_text(shares) == "pp 40 %, tp 10 %, dp 5 %"
    assert waits_text({}) == ""


@pytest.mark.parametrize(
    "bad", [{"@0,1": -1.0}, {"": 0.1}, {f"@{n}": 0.1 for n in range(wire_check.MAX_GROUPS + 1)}, [1]]
)
def test_a_batchs_group_waits_round_trip_and_bad_ones_are_refused(bad: object) -> None:
    batch = wire.Batch(rank=0, steps=[(0.02, {"collective": 0.01})], group_waits={"@0,1": 0.01, "dp@0,2": 0.002})
    assert wire_check.decode(wire.encode(batch)) == batch
    raw = json.loads(wire.encode(batch))
    raw["gw"] = bad
    assert wire_check.decode(json.dumps(raw).encode()) is None
