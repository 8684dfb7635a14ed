"""Issue 2's acceptance, per recorded host: saved nvidia-smi text -> `discover` -> config ->
`plan` puts every rank on its GPU's NUMA node with CPUs from that GPU's affinity, and
`exclusive` hands out disjoint whole cores. Runs the real CLI (click's runner, in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from openclaw_launch.cli.main import cli
from openclaw_launch.config.reader import load_config
from tests.topo_helpers import DATA, load_recorded, recorded_names, recorded_texts


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _write_inputs(tmp_path: Path, name: str) -> list[str]:
    topo, listing, numactl, lscpu = recorded_texts(name)
    (tmp_path / "topo.txt").write_text(topo)
    (tmp_path / "list.txt").write_text(listing)
    args = ["--from-smi", str(tmp_path / "topo.txt"), "--smi-list", str(tmp_path / "list.txt")]
    if numactl:
        (tmp_path / "numactl.txt").write_text(numactl)
        args += ["--numactl-hardware", str(tmp_path / "numactl.txt")]
    if lscpu:
        (tmp_path / "lscpu.txt").write_text(lscpu)
        args += ["--lscpu", str(tmp_path / "lscpu.txt")]
    return args


def _plan(tmp_path: Path, name: str, binding: str) -> dict:
    inputs = _write_inputs(tmp_path, name)
    config = tmp_path / f"{binding}.yaml"
    config.write_text(_invoke("discover", *inputs, "--node-name", "n0") + f"runtime:\n  binding: {binding}\n")
    load_config(config)  # a discovered config loads with no edits
    snapshot = tmp_path / "snap.json"
    _invoke("discover", "--snapshot", *inputs, "-o", str(snapshot))
    return json.loads(_invoke("plan", "--config", str(config), "--topology", str(snapshot), "--json"))


@pytest.mark.parametrize("name", recorded_names())
def test_node_binding_follows_gpu_affinity(tmp_path: Path, name: str) -> None:
    topo = load_recorded(name)
    plan = _plan(tmp_path, name, "node")
    assert [r["rank"] for r in plan["ranks"]] == list(range(len(topo.gpus)))
    for r in plan["ranks"]:
        gpu = topo.gpu_by_uuid(r["gpu_uuid"])
        assert gpu is not None
        assert r["numa_node"] == gpu.numa_node
        if gpu.cpu_affinity:
            assert set(r["cpus"]) <= set(gpu.cpu_affinity), f"rank {r['rank']} off its GPU's CPUs"
        if gpu.numa_node is not None and topo.numa_nodes.get(gpu.numa_node):
            assert set(r["cpus"]) <= set(topo.numa_nodes[gpu.numa_node])
            assert r["mem_nodes"] == [gpu.numa_node]


@pytest.mark.parametrize("name", recorded_names())
def test_exclusive_splits_whole_cores_without_overlap(tmp_path: Path, name: str) -> None:
    topo = load_recorded(name)
    plan = _plan(tmp_path, name, "exclusive")
    seen: set[int] = set()
    for r in plan["ranks"]:
        cpus = set(r["cpus"])
        assert cpus and not (cpus & seen), f"rank {r['rank']} overlaps another rank"
        seen |= cpus
        gpu = topo.gpu_by_uuid(r["gpu_uuid"])
        assert gpu is not None and (not gpu.cpu_affinity or cpus <= set(gpu.cpu_affinity))
        cores = {topo.core_of.get(c, c) for c in cpus}
        siblings = {c for c, core in topo.core_of.items() if core in cores}
        assert siblings <= cpus, f"rank {r['rank']} got part of a core"


def test_data_dir_holds_every_shared_topology() -> None:
    assert (DATA / "topologies" / "h200x2" / "nvidia-smi-topo-m.txt").exists()
    assert len(recorded_names()) >= 13
