"""TP/PP/DP layouts: pure over configs built from every recorded host, plus one real run."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import pytest
from cli_runner import invoke
from guards import GUARD_S

from openclaw_launch.config.discover import host_config
from openclaw_launch.config.parallel import ParallelSpec, size_problems
from openclaw_launch.config.reader import parse_config
from openclaw_launch.errors import ConfigError, PlanError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, PlanOptions
from openclaw_launch.plan.parallel import parallel_groups, plan_parallel, suggest_layouts
from openclaw_launch.topology.model import Topology
from openclaw_launch.topology.smi import topology_from_smi
from tests.topo_helpers import fake_smi_list, load_recorded, recorded_names

CONTEXT = run_context("r", "/tmp", None)  # a plan that is not run: no pid in its run directory

ROOT = Path(__file__).resolve().parent.parent


def _plan(topo: Topology, spec: ParallelSpec, nnodes: int = 1):  # type: ignore[no-untyped-def]
    cfg = host_config(topo, None, nnodes)
    options = PlanOptions(
        entry=Entry("script", "t.py"), node=cfg.nodes[0].name, numactl=None, parallel=spec, master_addr="10.0.0.1"
    )
    return cfg, build_plan(cfg, topo, CONTEXT, options)


@pytest.mark.parametrize("name", recorded_names())
def test_every_recorded_host_gets_nvlink_tp_groups_when_it_has_them(name: str) -> None:
    """tp=2 (and the largest suggested TP) on each recorded host: the groups partition the world,
    every rank's env agrees with the groups, and a host with NVLink pairs gets NVLinked TP groups."""
    topo = load_recorded(name)
    by_uuid = {g.uuid: g for g in topo.gpus}
    for tp in {2, suggest_layouts(host_config(topo, None))[0].tp}:
        cfg, plan = _plan(topo, ParallelSpec(tp=tp), nnodes=2)
        layout = plan.parallel
        assert layout is not None
        world = plan.world_size
        for dim in ("tp", "pp", "dp"):
            flat = sorted(r for g in layout.groups(dim) for r in g)
            assert flat == list(range(world)), dim
        for r in plan.ranks:
            c = layout.coords(r.rank)
            assert r.env["OPENCLAW_TP_RANK"] == str(c["tp"]) and r.env["OPENCLAW_TP_SIZE"] == str(tp)
            assert r.env["OPENCLAW_DP_SIZE"] == str(world // tp)
            group = next(g for g in layout.groups("tp") if r.rank in g)
            assert group.index(r.rank) == c["tp"]
        pairs_exist = any(topo.nvlinked(a, b) for a, b in combinations(topo.gpus, 2))
        for group in layout.groups("tp"):
            assert len({r // len(topo.gpus) for r in group}) == 1, "a TP group left its node"
            gpus = [by_uuid[plan.ranks[r % len(plan.ranks)].gpu_uuid] for r in group]
            joined = all(topo.nvlinked(a, b) for a, b in combinations(gpus, 2))
            if layout.nvlinked:
                assert joined
        if tp == 2 and pairs_exist and len(topo.gpus) % 2 == 0:
            assert layout.nvlinked is not None


def test_nvlink_pairs_that_are_not_index_neighbours_become_the_tp_groups() -> None:
    """GPU0-GPU2 and GPU1-GPU3 are NVLinked, neighbours by index are not: TP = [0,2], [1,3]."""
    matrix = (
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
        "GPU0\t X \tSYS\tNV4\tSYS\t0-3\n"
        "GPU1\tSYS\t X \tSYS\tNV4\t0-3\n"
        "GPU2\tNV4\tSYS\t X \tSYS\t0-3\n"
        "GPU3\tSYS\tNV4\tSYS\t X \t0-3\n"
    )
    topo = topology_from_smi(matrix, fake_smi_list(4, seed=99))
    cfg, plan = _plan(topo, ParallelSpec(tp=2))
    layout = plan.parallel
    assert layout is not None and layout.groups("tp") == [[0, 2], [1, 3]]
    assert layout.groups("dp") == [[0, 1], [2, 3]]
    assert not layout.identity and layout.nvlinked is True
    assert [r.env["OPENCLAW_TP_RANK"] for r in plan.ranks] == ["0", "0", "1", "1"]
    # the worker-side reader gives the same groups from the JSON file a run writes
    env = {"RANK": "2", "WORLD_SIZE": "4"}
    groups_file = json.dumps(plan.to_json()["parallel"])
    assert '"mesh": [[[0, 2], [1, 3]]]' in groups_file
    with pytest.raises(ValueError, match="DeviceMesh"):
        parallel_groups_from(groups_file, env).init_device_mesh_args()
    g = parallel_groups_from(groups_file, env)
    assert (g.tp_rank, g.dp_rank, g.group_of("tp"), g.group_of("dp")) == (1, 0, [0, 2], [2, 3])
    assert g.mesh == [[[0, 2], [1, 3]]]


def parallel_groups_from(text: str, env: dict[str, str]):  # type: ignore[no-untyped-def]
    """The groups a worker reads from a groups file holding ``text`` (the file is gone after)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        f.write(text)
        f.flush()
        return parallel_groups({**env, "OPENCLAW_PARALLEL_FILE": f.name})


def test_pcie_only_host_warns_and_keeps_index_order() -> None:
    topo = load_recorded("08")  # 2x A100 PCIe, SYS between them
    _, plan = _plan(topo, ParallelSpec(tp=2))
    assert plan.parallel is not None and plan.parallel.identity
    assert plan.parallel.nvlinked is None  # no NVLink peers at all
    assert any("no nvlink_peers" in w for w in plan.warnings)


def test_sizes_that_do_not_fit_are_one_rule_for_config_and_flags() -> None:
    ranks = {"a": 4, "b": 4}
    assert size_problems(ParallelSpec(tp=4, pp=2), 8, ranks) == []
    assert size_problems(ParallelSpec(tp=2, dp=2), 8, ranks) == [
        "tp x pp x dp must be the world size 8, but --tp 2, --dp 2 make 4"
    ]
    assert "a TP group must stay on one node" in size_problems(ParallelSpec(tp=8), 8, ranks)[0]
    topo = load_recorded("h200x2")
    with pytest.raises(PlanError, match="--tp 3 does not divide the 2 ranks of node localhost"):
        _plan(topo, ParallelSpec(tp=3, where={"tp": "--tp"}))
    text = "cluster:\n  nodes:\n    - name: a\n      cpu_workers: 4\nparallel:\n  tp: 3\n  pp: 0\n"
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert "parallel.pp (line 7): 0 is out of range" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_config(text.replace("pp: 0", "pp: 1"))
    assert "parallel (line 5): parallel.tp 3 does not divide the 4 ranks of node a" in str(e.value)
    cfg = parse_config(text.replace("tp: 3\n  pp: 0", "tp: 2\n  dp: 2"))
    layout = plan_parallel(cfg, cfg.parallel.overridden_by(ParallelSpec()))
    assert layout.groups("tp") == [[0, 1], [2, 3]] and layout.identity


def test_pipeline_stages_stride_over_tp_and_dp() -> None:
    cfg = parse_config("cluster:\n  nodes:\n    - {name: a, cpu_workers: 4}\n    - {name: b, cpu_workers: 4}\n")
    layout = plan_parallel(cfg, ParallelSpec(tp=2, pp=2))
    assert layout.mesh() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    env = {"RANK": "5", "WORLD_SIZE": "8", "OPENCLAW_TP_SIZE": "2", "OPENCLAW_PP_SIZE": "2"}
    g = parallel_groups(env)  # no file: the identity layout from the sizes
    assert (g.pp_rank, g.dp_rank, g.tp_rank) == (1, 0, 1)
    assert g.init_device_mesh_args() == {"mesh_shape": (2, 2, 2), "mesh_dim_names": ("pp", "dp", "tp")}


def test_run_writes_the_groups_file_and_workers_read_it(tmp_path: Path) -> None:
    """A real run: 4 CPU workers, --tp 2; each worker reads its groups with the package helper."""
    code = (
        "import openclaw_launch as o, os; g = o.parallel_groups(); "
        "print('GROUPS', os.environ['RANK'], g.tp_rank, g.dp_rank, g.group_of('tp'), "
        "os.path.basename(os.environ['OPENCLAW_PARALLEL_FILE']))"
    )
    out = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "4", "--tp", "2", "--telemetry", "off"]
        + ["--no-python", "--", sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert out.returncode == 0, out.stderr
    lines = sorted(line.split("GROUPS ", 1)[1] for line in out.stdout.splitlines() if "GROUPS " in line)
    assert lines == [
        "0 0 0 [0, 1] parallel.json",
        "1 1 0 [0, 1] parallel.json",
        "2 0 1 [2, 3] parallel.json",
        "3 1 1 [2, 3] parallel.json",
    ]


def test_plan_cli_suggests_layouts_and_names_the_flag(tmp_path: Path) -> None:
    snap = str(ROOT / "configs" / "h200x2.snapshot.json")
    base = [sys.executable, "-m", "openclaw_launch", "plan", "--topology", snap, "--nproc-per-node", "2"]
    out = subprocess.run([*base, "--suggest-parallel", "--json", "--", "t.py"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["parallel"] is None
    assert doc["parallel_suggestions"][0] == {"tp": 2, "pp": 1, "dp": 1, "tp_nvlinked": True}
    bad = invoke(*base[3:], "--dp", "3", "--", "t.py")  # base less the interpreter: in this process
    assert bad.returncode == 2
    assert bad.stderr.strip() == "openclaw-launch: tp x pp x dp must be the world size 2, but --dp 3 make 3"
