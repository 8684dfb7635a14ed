"""The nearest NIC per GPU on host trees built from recorded ``nvidia-smi topo -m`` matrices with NICs
(tests/nic_trees.py): the sysfs reader, the PCIe distance against the matrix, and the plan that
``runtime.nic_binding: nearest`` makes (one NCCL_IB_HCA / NCCL_SOCKET_IFNAME per rank)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from guards import GUARD_S
from nic_trees import PUBLIC, TREES, build_tree, nic_columns, tree_listing
from topo_helpers import fake_uuid

from openclaw_launch.agents.fingerprint import fingerprint
from openclaw_launch.cli.main import cli
from openclaw_launch.config.discover import config_yaml_from_topology
from openclaw_launch.config.reader import load_config
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, LaunchPlan, PlanOptions
from openclaw_launch.topology import live
from openclaw_launch.topology.live import discover_topology
from openclaw_launch.topology.model import Topology
from openclaw_launch.topology.nic import TIERS, distance
from openclaw_launch.topology.smi import SmiTopo, parse_topo_matrix
from openclaw_launch.topology.snapshot import load_snapshot, save_snapshot

DATA = Path(__file__).parent / "data"
#: nvidia-smi's PCIe levels, nearest first, and the tier each is in.
_LEVEL_TIER = {"PIX": TIERS[0], "PXB": TIERS[0], "PHB": TIERS[1], "NODE": TIERS[2], "SYS": TIERS[3]}
_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")


def _tree(name: str) -> Path:
    return DATA / "sysfs" / name


def _host(root: Path) -> Topology:
    return discover_topology(root, nvml_facts=False, environ={})


def _config(tmp_path: Path, topology: Topology, binding: str = "nearest") -> Path:
    path = tmp_path / "host.yaml"
    path.write_text(config_yaml_from_topology(topology, "host", None) + f"runtime:\n  nic_binding: {binding}\n")
    return path


def _plan(tmp_path: Path, root: Path, binding: str = "nearest") -> LaunchPlan:
    topology = _host(root)
    config = load_config(str(_config(tmp_path, topology, binding)))
    options = PlanOptions(entry=Entry("script", "train.py"), node="host", numactl=None)
    return build_plan(config, topology, run_context("nic", "/tmp", None), options)


def _recorded(name: str) -> tuple[SmiTopo, dict[str, str], Topology]:
    """The recorded matrix, NIC name -> its matrix column, and the tree read back."""
    smi = parse_topo_matrix((PUBLIC / f"{TREES[name].stem}.txt").read_text())
    return smi, nic_columns(TREES[name]), _host(_tree(name))


def _expected(name: str) -> dict[str, set[str]]:
    """GPU UUID -> the NICs the recorded matrix puts nearest it."""
    smi, column_of, _ = _recorded(name)
    out = {}
    for g in smi.gpus:
        cells = {nic: smi.matrix[(f"GPU{g.index}", column)] for nic, column in column_of.items()}
        best = min(cells.values(), key=_ORDER.index)
        out[fake_uuid(g.index, _seed(name))] = {n for n, c in cells.items() if c == best}
    return out


def _seed(name: str) -> int:
    return int(TREES[name].stem.split("_")[0])


@pytest.mark.parametrize("name", sorted(TREES))
def test_the_committed_trees_are_what_the_recorded_matrices_build(tmp_path: Path, name: str) -> None:
    build_tree(tmp_path / name, TREES[name])
    assert tree_listing(tmp_path / name) == tree_listing(_tree(name)), "run python tests/nic_trees.py"


@pytest.mark.parametrize("name", sorted(TREES))
def test_every_gpu_nic_distance_is_the_recorded_matrix_level(name: str) -> None:
    """Read back through sysfs, each GPU-NIC pair is as near as nvidia-smi said, PIX nearer than PXB."""
    smi, column_of, host = _recorded(name)
    by_uuid = {g.uuid: g for g in host.gpus}
    assert len(host.nics) == len(column_of) == len([d for d in smi.devices if d.startswith("NIC")])
    assert {n.kind for n in host.nics} == {TREES[name].kind} and all(n.link_up for n in host.nics)
    for g in smi.gpus:
        gpu = by_uuid[fake_uuid(g.index, _seed(name))]
        level = {n.name: smi.matrix[(f"GPU{g.index}", column_of[n.name])] for n in host.nics}
        for nic in host.nics:
            assert TIERS[distance(gpu, nic)[0]] == _LEVEL_TIER[level[nic.name]], (g.index, nic.name, level)
        pix = [n for n in host.nics if level[n.name] == "PIX"]
        pxb = [n for n in host.nics if level[n.name] == "PXB"]
        assert all(distance(gpu, a) < distance(gpu, b) for a in pix for b in pxb)


def test_dgx_a100_eight_gpus_eight_nics_one_each_the_one_behind_its_switch(tmp_path: Path) -> None:
    plan = _plan(tmp_path, _tree("dgx_a100_nics"))
    expected = _expected("dgx_a100_nics")
    nics = [r.nic for r in plan.ranks]
    assert len(plan.ranks) == 8 and len(set(nics)) == 8  # the storage NICs mlx5_8/9 (SYS to all) unused
    for r in plan.ranks:
        assert r.nic in expected[r.gpu_uuid or ""] and r.env["NCCL_IB_HCA"] == f"={r.nic}"
        assert "NCCL_SOCKET_IFNAME" not in r.env
    assert nics == [f"mlx5_{i}" for i in range(8)] and not [w for w in plan.warnings if "NIC" in w]


def test_hgx_h100_each_gpu_gets_its_pix_nic_and_gpu7_shares_gpu6s(tmp_path: Path) -> None:
    """The recorded host lists no mlx5_9: GPU7 is PXB to mlx5_8 (GPU6's PIX NIC) and NODE to the rest."""
    plan = _plan(tmp_path, _tree("hgx_h100_nics"))
    expected = _expected("hgx_h100_nics")
    assert [r.nic for r in plan.ranks] == [
        "mlx5_0",
        "mlx5_1",
        "mlx5_2",
        "mlx5_3",
        "mlx5_6",
        "mlx5_7",
        "mlx5_8",
        "mlx5_8",
    ]
    assert all({r.nic} == expected[r.gpu_uuid or ""] for r in plan.ranks)


def test_ethernet_only_nics_go_to_nccl_socket_ifname_nearest_by_numa_node(tmp_path: Path) -> None:
    plan = _plan(tmp_path, _tree("asus_4x_ethernet"))
    expected = _expected("asus_4x_ethernet")
    assert len({r.nic for r in plan.ranks}) == 4
    for r in plan.ranks:
        assert r.nic in expected[r.gpu_uuid or ""] and r.env["NCCL_SOCKET_IFNAME"] == f"={r.nic}"
        assert "NCCL_IB_HCA" not in r.env


def test_a_down_nic_is_passed_over_for_the_other_one_as_near(tmp_path: Path) -> None:
    root = tmp_path / "host"
    shutil.copytree(_tree("dgx_a100_nics"), root, symlinks=True)
    (root / "sys/class/infiniband/mlx5_0/ports/1/state").write_text("1: DOWN\n")
    plan = _plan(tmp_path, root)
    assert [r.nic for r in plan.ranks][:2] == ["mlx5_1", "mlx5_1"]


def test_off_by_default_and_no_nic_found_is_a_warning_not_an_error(tmp_path: Path) -> None:
    plan = _plan(tmp_path, _tree("dgx_a100_nics"), binding="none")
    assert all(r.nic is None and "NCCL_IB_HCA" not in r.env for r in plan.ranks)
    bare = _plan(tmp_path, DATA / "hosts" / "h200x1")  # the recorded H200 VM: no NIC in its tree
    assert [r.nic for r in bare.ranks] == [None]
    assert any("runtime.nic_binding: nearest, but" in w and "NCCL picks its NICs itself" in w for w in bare.warnings)


def test_plan_shows_each_ranks_nic_and_the_fingerprint_leaves_the_per_rank_nic_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree("dgx_a100_nics")
    monkeypatch.setattr(live, "HOST_ROOT", root)
    config = _config(tmp_path, _host(root))
    result = CliRunner().invoke(cli, ["plan", "--config", str(config), "train.py"])
    assert result.exit_code == 0, result.output
    header, *rows = [line for line in result.output.splitlines() if line[:1].isdigit() or line.startswith("rank ")]
    assert header.split()[8:] == ["nic", "argv"] and rows[7].split()[8] == "mlx5_7", result.output
    plan = _plan(tmp_path, root)
    fp = fingerprint(load_config(str(config)), plan, {}, {})
    assert "env.NCCL_IB_HCA" not in fp and fp["gpu.count"] == "8" and fp["gpu.models"] == "NVIDIA A100-SXM4-40GB"


def test_a_nic_binding_not_in_the_choices_exits_2_naming_the_key_line_and_choices(tmp_path: Path) -> None:
    config = _config(tmp_path, _host(_tree("dgx_a100_nics")), binding="closest")
    line = config.read_text().splitlines().index("  nic_binding: closest") + 1
    result = CliRunner().invoke(cli, ["plan", "--config", str(config), "train.py"])
    assert result.exit_code == 2
    assert f"runtime.nic_binding (line {line}): 'closest' is not valid" in result.output
    assert "expected one of 'none', 'nearest'" in result.output


def _snapshot(tmp_path: Path, root: Path) -> Path:
    path = tmp_path / "host.snapshot.json"
    save_snapshot(_host(root), path)
    return path


def test_a_snapshot_keeps_the_nics_and_pci_paths_so_plan_chooses_alike_elsewhere(tmp_path: Path) -> None:
    host = _host(_tree("hgx_h100_nics"))
    assert load_snapshot(_snapshot(tmp_path, _tree("hgx_h100_nics"))) == host
    assert host.nics and all(g.pci_path and g.pci_root for g in host.gpus)


def test_validate_checks_each_gpus_nic_and_shows_the_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "host"
    shutil.copytree(_tree("hgx_h100_nics"), root, symlinks=True)
    (root / "sys/class/infiniband/mlx5_3/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    (root / "sys/class/infiniband/mlx5_8/ports/1/state").write_text("1: DOWN\n")
    monkeypatch.setattr(live, "HOST_ROOT", root)  # the fingerprint's driver version
    config, snapshot = _config(tmp_path, _host(root)), _snapshot(tmp_path, root)
    result = CliRunner().invoke(cli, ["validate", "--config", str(config), "--topology", str(snapshot), "--json"])
    out = json.loads(result.output[result.output.index("{") :])
    checks = {c["subject"].split()[1]: c for c in out["checks"] if c["name"] == "nic_binding"}
    assert [checks[str(i)]["status"] for i in range(8)] == ["pass"] * 3 + ["warn"] + ["pass"] * 4
    assert checks["3"]["found"] == "mlx5_3 (PCIe switch; up, 200 Gb/s)" and checks["3"]["expected"] == "up, 400 Gb/s"
    assert checks["6"]["found"].startswith("mlx5_10 (NUMA node; up")  # mlx5_8 down: the next one up instead
    fp = out["fingerprint"]
    assert fp["version.driver"] == "580.126.20" and fp["gpu.models"] == "NVIDIA H100 80GB HBM3"
    assert fp["gpu.order"] == "0,1,2,3,4,5,6,7" and len(fp["config.sha256"]) == 64 and "env.NCCL_IB_HCA" not in fp
    text = CliRunner().invoke(cli, ["validate", "--config", str(config), "--topology", str(snapshot)]).output
    assert "fingerprint (what the agents of a multi-node run compare; docs/multinode.md):" in text
    assert f"  config.sha256 = {fp['config.sha256']}" in text and "  version.driver = 580.126.20" in text
    assert "config.nodes[0]" not in text  # the flattened config shows as its hash


def test_run_gives_each_worker_its_nic_and_the_report_reads_it_back(tmp_path: Path) -> None:
    """Real worker processes on the recorded DGX A100 tree (a fresh interpreter whose host root is the
    tree): each writes the NCCL_IB_HCA it got; the report's rank entries name the same NICs."""
    root = _tree("dgx_a100_nics")
    config = tmp_path / "host.yaml"
    config.write_text(_config(tmp_path, _host(root)).read_text() + "  binding: none\n")
    report, seen = tmp_path / "run.json", tmp_path / "nic-{rank}"
    worker = ["sh", "-c", f'printf %s "$NCCL_IB_HCA" > {tmp_path}/nic-$RANK']
    args = ["--config", str(config), "--telemetry", "off", "--report", str(report), "--no-python", "--", *worker]
    code = (
        "from pathlib import Path; from openclaw_launch.topology import live; "
        f"live.HOST_ROOT = Path({str(root)!r}); from openclaw_launch.cli.main import cli; "
        f"cli({args!r})"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_"))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=GUARD_S)
    assert done.returncode == 0, done.stdout + done.stderr
    given = [Path(str(seen).format(rank=r)).read_text() for r in range(8)]
    assert given == [f"=mlx5_{r}" for r in range(8)]
    assert [r["nic"] for r in json.loads(report.read_text())["ranks"]] == [f"mlx5_{r}" for r in range(8)]


def test_a_nic_variable_given_by_hand_is_replaced_per_rank_with_a_warning(tmp_path: Path) -> None:
    topology = _host(_tree("dgx_a100_nics"))
    config = load_config(str(_config(tmp_path, topology)))
    options = PlanOptions(entry=Entry("script", "t.py"), node="host", numactl=None, base_env={"NCCL_IB_HCA": "mlx5_9"})
    plan = build_plan(config, topology, run_context("nic", "/tmp", None), options)
    assert [r.env["NCCL_IB_HCA"] for r in plan.ranks] == [f"=mlx5_{i}" for i in range(8)]
    assert "runtime.nic_binding: nearest sets NCCL_IB_HCA per rank; the value given for it is not used" in plan.warnings
