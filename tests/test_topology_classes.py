"""Issue 8, "topology classes that are planned wrong": recorded-text shapes written for these tests
(tests/data/topologies/constructed, see the README there) through `discover --from-smi` -> plan, as
tests/test_recorded_hosts.py does for the real hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from openclaw_launch.cli.main import cli
from openclaw_launch.config.reader import load_config
from openclaw_launch.topology.smi import parse_topo_matrix, topology_from_smi
from tests.topo_helpers import TOPOLOGIES

CONSTRUCTED = TOPOLOGIES / "constructed"
GB = CONSTRUCTED / "gb200_4x_grace_numa_affinity_lists"
SLURM = CONSTRUCTED / "slurm_cgroup_4x_no_cpu_affinity_on_node1"


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _plan(tmp_path: Path, base: Path, numactl: bool, binding: str = "node") -> dict:
    inputs = ["--from-smi", f"{base}.txt", "--smi-list", f"{base}.smi-L.txt"]
    if numactl:
        inputs += ["--numactl-hardware", f"{base}.numactl.txt"]
    config = tmp_path / "c.yaml"
    config.write_text(_invoke("discover", *inputs, "--node-name", "n0") + f"runtime:\n  binding: {binding}\n")
    load_config(config)
    snapshot = tmp_path / "snap.json"
    _invoke("discover", "--snapshot", *inputs, "-o", str(snapshot))
    return json.loads(_invoke("plan", "--config", str(config), "--topology", str(snapshot), "--json"))


def test_grace_blackwell_numa_affinity_list_parses_to_the_cpu_node() -> None:
    rows = parse_topo_matrix(Path(f"{GB}.txt").read_text()).gpus
    assert [r.numa_nodes for r in rows][0] == (0, *range(3, 10), *range(11, 18))
    assert [r.gpu_numa_id for r in rows] == [2, 10, 18, 26]
    topo = topology_from_smi(Path(f"{GB}.txt").read_text(), Path(f"{GB}.smi-L.txt").read_text())
    assert [g.numa_node for g in topo.gpus] == [0, 0, 1, 1]
    assert topo.numa_nodes == {0: tuple(range(72)), 1: tuple(range(72, 144))}


@pytest.mark.parametrize("numactl", [True, False])
@pytest.mark.parametrize("binding", ["node", "exclusive"])
def test_grace_blackwell_binds_to_the_cpu_node_never_a_gpu_memory_node(
    tmp_path: Path, numactl: bool, binding: str
) -> None:
    plan = _plan(tmp_path, GB, numactl, binding)
    assert [r["numa_node"] for r in plan["ranks"]] == [0, 0, 1, 1]
    for r in plan["ranks"]:
        home = range(72) if r["numa_node"] == 0 else range(72, 144)
        assert r["cpus"] and set(r["cpus"]) <= set(home)
        assert (r["mem_policy"], r["mem_nodes"]) == ("bind", [r["numa_node"]])
        assert f"--membind={r['numa_node']}" in r["argv"]


def test_empty_cpu_affinity_cell_keeps_the_numa_node() -> None:
    rows = parse_topo_matrix(Path(f"{SLURM}.txt").read_text()).gpus
    assert [(r.cpu_affinity is None, r.numa_affinity, r.gpu_numa_id) for r in rows] == [
        (False, 0, None),
        (False, 0, None),
        (True, 1, None),
        (True, 1, None),
    ]


def test_slurm_cgroup_without_cpus_near_a_gpu_says_so_in_the_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path, SLURM, numactl=False)
    job_cpus = [*range(8), *range(64, 72)]
    assert [r["numa_node"] for r in plan["ranks"]] == [0, 0, 1, 1]
    for r in plan["ranks"]:
        assert set(r["cpus"]) <= set(job_cpus)
    assert [r["cpus"] for r in plan["ranks"][2:]] == [job_cpus, job_cpus]
    for gpu in (2, 3):
        assert any(w.startswith(f"GPU {gpu} (") and "no CPUs on its NUMA node 1" in w for w in plan["warnings"])
    assert not any("GPU 0 (" in w or "GPU 1 (" in w for w in plan["warnings"])
