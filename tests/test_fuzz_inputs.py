"""Issue 8: no input gives a traceback or a hang. Mutations of the shipped configs and snapshots
(in process: only a clean result or an OpenclawError), and bad values for the launcher's options
through the command line's error handling (only exit 2 with a message; in this process,
tests/cli_runner.py, and one of them through the real entry point)."""

from __future__ import annotations

import contextlib
import copy
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_runner import invoke
from guards import GUARD_S

from openclaw_launch.codec import to_json
from openclaw_launch.config.reader import parse_config
from openclaw_launch.errors import OpenclawError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, PlanOptions
from openclaw_launch.report.build import load_report
from openclaw_launch.report.format import format_report
from openclaw_launch.topology.snapshot import topology_from_snapshot
from tests.report_samples import HANG, PREFLIGHT, STRAGGLER, node_report

CONTEXT = run_context("r", "/tmp", None)  # a plan that is not run: no pid in its run directory

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SNAPSHOTS = sorted((ROOT / "configs").glob("*.snapshot.json"))
MUTATIONS_PER_FILE = 60

_WEIRD: list[Any] = [
    None,
    True,
    -1,
    0,
    2**63,
    10**30,
    1.5,
    float("nan"),
    "",
    "zero",
    "0-4000000000",
    "x" * 5000,
    [],
    {},
    [[[]]],
    {"a": {"b": 1}},
    "0-3,8",
    "GPU-" + "f" * 36,
]


def _paths(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*path, i))


def _mutate(data: Any, rng: random.Random) -> Any:
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(data) if p]
        if not paths:
            return rng.choice(_WEIRD)
        path = rng.choice(paths)
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        how = rng.random()
        if how < 0.25 and isinstance(parent, dict):
            del parent[path[-1]]
        elif how < 0.35 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
        else:
            parent[path[-1]] = rng.choice(_WEIRD)
    return data


def _nest(depth: int) -> str:
    return "cluster:\n  nodes: " + "[" * depth + "]" * depth + "\n"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_mutated_configs_load_and_plan_or_fail_cleanly(config: Path) -> None:
    rng = random.Random(f"config-{config.name}")
    original = yaml.safe_load(config.read_text())
    snapshot = ROOT / "configs" / config.name.replace(".yaml", ".snapshot.json")
    topology = topology_from_snapshot(json.loads(snapshot.read_text())) if snapshot.exists() else None
    texts = [yaml.safe_dump(_mutate(original, rng)) for _ in range(MUTATIONS_PER_FILE)]
    texts += [_nest(600), config.read_text()[: rng.randint(1, 200)], "\0\x01\xff", "a: &x [*x]"]
    for text in texts:
        try:
            cfg = parse_config(text, "fuzz.yaml")
        except OpenclawError:
            continue
        if topology is None:
            continue
        options = PlanOptions(entry=Entry("script", "train.py", ()), node=cfg.nodes[0].name, base_env={})
        with contextlib.suppress(OpenclawError):
            build_plan(cfg, topology, CONTEXT, options)


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.name)
def test_mutated_snapshots_load_or_fail_cleanly(snapshot: Path) -> None:
    rng = random.Random(f"snapshot-{snapshot.name}")
    original = json.loads(snapshot.read_text())
    for _ in range(MUTATIONS_PER_FILE * 2):
        data = _mutate(original, rng)
        with contextlib.suppress(OpenclawError):
            topology_from_snapshot(data if isinstance(data, dict) else {"schema": data}, "fuzz.json")


def test_mutated_reports_are_refused_with_the_field(tmp_path: Path) -> None:
    good = to_json(node_report(stragglers=(STRAGGLER,), hang=HANG, preflight=PREFLIGHT))
    rng = random.Random("report")
    path = tmp_path / "r.json"
    for _ in range(MUTATIONS_PER_FILE * 2):
        path.write_text(json.dumps(_mutate(good, rng), allow_nan=True))
        try:
            format_report(load_report(path))
        except OpenclawError as e:
            assert str(path) in str(e)
    path.write_text(json.dumps({**good, "ranks": None}))
    with pytest.raises(OpenclawError, match="ranks: expected a list"):
        load_report(path)


def test_mutated_preflight_recordings_load_or_fail_cleanly() -> None:
    """A --record file mutated: a Recording, or a ValueError saying what is wrong (never another
    exception); compared with a run: floors and warnings, or a ValueError."""
    from openclaw_launch.preflight.record import recorded_floors, usable_floors
    from openclaw_launch.preflight.tiers import Tier
    from openclaw_launch.safe_read import parse_json

    good = {
        "format": "openclaw-preflight-record/1",
        "node": "localhost",
        "tiers": {"node": {"busbw_gbps": 1.5, "size_bytes": 4 << 20, "ranks": 2, "gpus": []}},
    }
    topology = topology_from_snapshot(json.loads(SNAPSHOTS[0].read_text()))
    cfg = parse_config(CONFIGS[0].read_text(), "c.yaml")
    options = PlanOptions(entry=Entry("script", "train.py", ()), node=cfg.nodes[0].name, base_env={})
    plan = build_plan(cfg, topology, CONTEXT, options)
    tiers = [Tier("node", "node", tuple(r.rank for r in plan.ranks))]
    rng = random.Random("recording")
    for _ in range(MUTATIONS_PER_FILE * 3):
        text = json.dumps(_mutate(good, rng), allow_nan=True)
        try:
            recording = recorded_floors(parse_json(text))
        except ValueError:
            continue
        with contextlib.suppress(ValueError):
            usable_floors(recording, "rec.json", tiers, plan, 4 << 20)


BAD_OPTIONS = [
    ["--grace-period-s", "nan"],
    ["--grace-period-s", "inf"],
    ["--kill-timeout-s", "-1"],
    ["--restart-backoff-s", "1e309"],
    ["--max-restarts", "1100"],
    ["--nproc-per-node", "1000000"],
    ["--nnodes", "0"],
    ["--node-rank", "-3"],
    ["--console-ranks", "0-4000000000"],
    ["--prefix", "{nosuch} "],
    ["--prefix", "{rank"],
    ["--prefix", "{rank:>999999999}"],
    ["--master-addr", "$(id) bad host"],
    ["--rdzv-endpoint", "bad host:1"],
    ["--stats-interval-s", "nan"],
    ["--agent-timeout-s", "nan"],
    ["--keepalive-s", "1e300"],
    ["--monitor-interval", "-inf"],
    ["--straggler-threshold-pct", "1e9"],
    ["--config", "/dev/zero"],
    ["--topology", "/dev/zero"],
    ["--report", "/proc/self/x.json"],
]


@pytest.mark.parametrize("bad", BAD_OPTIONS, ids=lambda a: " ".join(a)[:40])
def test_bad_option_values_exit_2_with_the_option_named(bad: list[str], tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    args = ["--nproc-per-node", "1", *bad, "--no-python", "--"]
    args += [sys.executable, "-c", f"open({str(ready)!r}, 'w').close()"]
    if bad[0] in ("--nproc-per-node", "--config"):
        args[0:2] = []
    if bad[0] == "--master-addr":  # through the entry point
        proc = subprocess.run(
            [sys.executable, "-m", "openclaw_launch", *args], cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S
        )
    else:
        proc = invoke(*args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    name = bad[0] if bad[0] not in ("--config", "--topology") else "/dev/zero"
    assert name in proc.stderr or name.replace("-", "_") in proc.stderr, proc.stderr
    assert not ready.exists()  # refused before anything started
