"""Issue 8, "every rule in one place": each rule has one definition that config loading, ``plan``,
``validate`` and the MPS daemon all use, and the documented key reference is held to it."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

import openclaw_launch.config.model as config_module
from openclaw_launch.config import document
from openclaw_launch.config.model import (
    RUNTIME_KEYS,
    Config,
    NodeSpec,
    Runtime,
    pinned_limit_problem,
    procs_per_gpu_problem,
)
from openclaw_launch.config.parallel import PARALLEL_DIMS
from openclaw_launch.config.reader import parse_config
from openclaw_launch.errors import ConfigError, LaunchError, PlanError, TopologyError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, LaunchPlan, MpsPlan, PlanOptions, RankPlan
from openclaw_launch.run.mps.commands import check_client_limit, validate_pinned_limit
from openclaw_launch.run.mps.control import FIX_HINT
from openclaw_launch.run.mps.daemon import MpsDaemon, start_mps
from openclaw_launch.topology.model import GpuInfo, NvLink, Topology
from openclaw_launch.validate.host import run_checks

CONTEXT = run_context("r", "/tmp", None)  # a plan that is not run: no pid in its run directory

UUID0 = "GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee"


def _reference() -> dict[str, list[str]]:
    """The key reference of ``config``'s docstring: section path -> its keys, in order."""
    doc = config_module.__doc__ or ""
    block = doc.split("Reference (every key; ``*`` = required)::", 1)[1].split("\n\n", 2)[1]
    sections: dict[str, list[str]] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        m = re.match(r"^( *)(- )?([a-z_]+):", line)
        if not m:
            continue
        indent = len(m.group(1)) + (2 if m.group(2) else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = ".".join(k for _, k in stack)
        sections.setdefault(parent, []).append(m.group(3))
        stack.append((indent, m.group(3)))
    return sections


def test_documented_runtime_keys_are_the_runtime_fields() -> None:
    ref = _reference()
    assert ref["runtime"] == [f.name for f in fields(Runtime)] == list(RUNTIME_KEYS)


def test_documented_keys_are_the_keys_config_loading_reads() -> None:
    ref = _reference()
    assert tuple(ref[""]) == document.TOP_KEYS
    assert tuple(ref["cluster"]) == document.CLUSTER_KEYS
    assert tuple(ref["cluster.nodes"]) == document.NODE_KEYS
    assert tuple(ref["cluster.nodes.gpus"]) == document.GPU_KEYS
    assert tuple(ref["parallel"]) == PARALLEL_DIMS
    assert tuple(ref["preflight"]) == document.PREFLIGHT_KEYS


def test_every_runtime_key_has_one_reader_and_is_read() -> None:
    assert list(document.ConfigChecker().runtime_readers()) == list(RUNTIME_KEYS)


def _cfg(**runtime: object) -> Config:
    return Config(nodes=(NodeSpec(name="n0", gpus=()),), runtime=Runtime(**runtime))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("procs", "mps", "limit"),
    [(2, False, None), (3, True, 2), (1, False, None), (2, True, 2), (4, True, None)],
)
def test_procs_per_gpu_rule_is_the_same_in_config_plan_and_mps(procs: int, mps: bool, limit: int | None) -> None:
    problem = procs_per_gpu_problem(procs, mps, limit)
    text = f"cluster:\n  nodes:\n    - name: n0\n      gpus:\n        - uuid: {UUID0}\nruntime:\n"
    text += f"  procs_per_gpu: {procs}\n  enable_mps: {str(mps).lower()}\n"
    text += f"  mps_max_clients_per_gpu: {limit}\n" if limit is not None else ""
    if problem is None:
        parse_config(text)
    else:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert problem in str(info.value) and "runtime.procs_per_gpu (line 7)" in str(info.value)
    # plan: a Config built in code (not loaded) is held to the same rule
    cfg = Config(
        nodes=(NodeSpec(name="n0", gpus=(config_module.GpuSpec(uuid=UUID0),)),),
        runtime=Runtime(procs_per_gpu=procs, enable_mps=mps, mps_max_clients_per_gpu=limit),
    )
    topo = Topology(gpus=(GpuInfo(0, UUID0),), allowed_cpus=tuple(range(8)))
    options = PlanOptions(entry=Entry("script", "t.py"), numactl=None)
    if problem is None:
        build_plan(cfg, topo, CONTEXT, options)
    else:
        with pytest.raises(PlanError, match=re.escape(problem)):
            build_plan(cfg, topo, CONTEXT, options)
    # the MPS daemon's client count: the same message for the same numbers
    if mps and limit is not None and procs > limit:
        ranks = tuple(RankPlan(i, i, "n0", 0, UUID0, 0, None, None, (), "none", (), ("x",), {}) for i in range(procs))
        mps_plan = MpsPlan(limit, None, None, "error", (UUID0,))
        plan = LaunchPlan("r", "n0", 0, 1, procs, "127.0.0.1", 1, "nccl", ranks, mps=mps_plan, run_dir=CONTEXT.run_dir)
        with pytest.raises(PlanError, match=re.escape(problem)):
            check_client_limit(plan)


@pytest.mark.parametrize("value", ["40G", "512M", "10GB", "0G", "1.5G", "40g", "G"])
def test_pinned_memory_rule_is_the_same_in_config_and_mps(value: str) -> None:
    problem = pinned_limit_problem(value)
    text = f"cluster:\n  nodes:\n    - name: n0\n      gpus:\n        - uuid: {UUID0}\nruntime:\n"
    text += f"  enable_mps: true\n  mps_pinned_device_mem_limit: '{value}'\n"
    if problem is None:
        assert parse_config(text).runtime.mps_pinned_device_mem_limit == value
        assert validate_pinned_limit(value) == value
    else:
        with pytest.raises(ConfigError, match=re.escape(problem)):
            parse_config(text)
        with pytest.raises(PlanError, match=re.escape(problem)):
            validate_pinned_limit(value)


def test_mps_start_failure_hint_is_printed_once(tmp_path: Path) -> None:
    mps_plan = MpsPlan(None, None, None, "error", (UUID0,))
    with pytest.raises(LaunchError) as info:
        MpsDaemon(mps_plan, tmp_path / "run", control=str(tmp_path / "no-such-mps-control")).start()
    assert str(info.value).count(FIX_HINT) == 1
    ranks = (RankPlan(0, 0, "n0", 0, UUID0, 0, None, None, (), "none", (), ("x",), {}),)
    plan = LaunchPlan("r", "n0", 0, 1, 1, "127.0.0.1", 1, "nccl", ranks, mps=mps_plan, run_dir=CONTEXT.run_dir)
    with pytest.raises(LaunchError) as info:
        start_mps(plan, tmp_path / "run2", control=str(tmp_path / "no-such-mps-control"))
    assert str(info.value).count(FIX_HINT) == 1


# --- the cpuset's memory nodes (Mems_allowed) -----------------------------------------------------


def _two_node_host(allowed_mems: tuple[int, ...]) -> Topology:
    gpus = tuple(
        GpuInfo(
            i, f"GPU-0000000{i}-0000-4000-8000-000000000000", numa_node=i, cpu_affinity=tuple(range(8 * i, 8 * i + 8))
        )
        for i in range(2)
    )
    return Topology(
        gpus=gpus,
        numa_nodes={0: tuple(range(8)), 1: tuple(range(8, 16))},
        allowed_cpus=tuple(range(16)),
        allowed_mems=allowed_mems,
        source="test",
    )


def _gpu_plan(topo: Topology, **runtime: object) -> LaunchPlan:
    specs = tuple(config_module.GpuSpec(uuid=g.uuid or "") for g in topo.gpus)
    cfg = Config(nodes=(NodeSpec(name="n0", gpus=specs),), runtime=Runtime(**runtime))  # type: ignore[arg-type]
    return build_plan(cfg, topo, CONTEXT, PlanOptions(entry=Entry("script", "t.py"), numactl="numactl"))


def test_memory_nodes_outside_mems_allowed_never_reach_membind() -> None:
    plan = _gpu_plan(_two_node_host(allowed_mems=(0,)))
    r0, r1 = plan.ranks
    assert (r0.mem_policy, r0.mem_nodes) == ("bind", (0,)) and "--membind=0" in r0.argv
    assert (r1.mem_policy, r1.mem_nodes) == ("none", ()) and not any("--membind" in a for a in r1.argv)
    assert r1.cpus == tuple(range(8, 16))  # the CPUs stay where they were planned
    assert any("NUMA node(s) 1 are not among the memory nodes" in w and "Mems_allowed: 0" in w for w in plan.warnings)
    preferred = _gpu_plan(_two_node_host(allowed_mems=(0,)), mem_policy="preferred").ranks[1]
    assert not any(a.startswith("--preferred") for a in preferred.argv)


def test_allowed_mems_unknown_or_wide_enough_changes_nothing() -> None:
    for mems in ((), (0, 1)):
        plan = _gpu_plan(_two_node_host(allowed_mems=mems))
        assert [r.mem_nodes for r in plan.ranks] == [(0,), (1,)]
        assert not any("Mems_allowed" in w for w in plan.warnings)


def test_cpu_workers_memory_nodes_checked_too() -> None:
    topo = _two_node_host(allowed_mems=(1,))
    cfg = Config(nodes=(NodeSpec(name="n0", cpu_workers=2),))
    plan = build_plan(cfg, topo, CONTEXT, PlanOptions(entry=Entry("script", "t.py"), numactl="numactl"))
    assert [r.mem_nodes for r in plan.ranks] == [(), (1,)]
    assert any("CPU worker 0: NUMA node(s) 0" in w for w in plan.warnings)


def test_allowed_mems_read_from_the_injected_root_and_kept_in_snapshots(tmp_path: Path) -> None:
    from openclaw_launch.topology.snapshot import dump_snapshot, topology_from_snapshot
    from openclaw_launch.topology.sysfs import read_allowed_mems

    status = tmp_path / "proc" / "self" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tpython3\nMems_allowed:\t00000000,00000005\nMems_allowed_list:\t0,2\n")
    assert read_allowed_mems(tmp_path) == (0, 2)
    assert read_allowed_mems(tmp_path / "nowhere") == ()
    topo = _two_node_host(allowed_mems=(0, 2))
    doc = dump_snapshot(topo)
    assert doc["allowed_mems"] == "0,2"
    assert topology_from_snapshot(doc).allowed_mems == (0, 2)
    del doc["allowed_mems"]  # a snapshot from before the field: unknown
    assert topology_from_snapshot(doc).allowed_mems == ()


# --- a configured GPU against the host: plan and validate judge with config/checks.py ------------

UUID1 = "GPU-593502f1-407a-3b77-45a0-032830195d52"
BUS0, BUS1 = "0000:00:06.0", "0000:00:07.0"


def _pair(links: tuple[NvLink, ...], numa: int | None = 0) -> Topology:
    gpus = (
        GpuInfo(0, UUID0, pci_bus_id=BUS0, numa_node=numa, nvlinks=links),
        GpuInfo(1, UUID1, pci_bus_id=BUS1, numa_node=numa),
    )
    return Topology(gpus=gpus, numa_nodes={0: tuple(range(8))}, allowed_cpus=tuple(range(8)), source="test")


_UP = tuple(NvLink(link=i, active=True, remote_bus_id=BUS1, remote_type="gpu") for i in range(2))
_DOWN = tuple(NvLink(link=i, active=False, remote_bus_id=BUS1, remote_type="gpu") for i in range(2))


@pytest.mark.parametrize(
    ("spec", "topology", "mismatched"),
    [
        ({"pci_bus_id": BUS0, "numa_node": 0, "nvlink_peers": (UUID1,)}, _pair(_UP), set()),
        ({"pci_bus_id": "0000:00:09.0"}, _pair(_UP), {"bus_id"}),
        ({"pci_bus_id": "00000000:00:06.0"}, _pair(_UP), set()),  # NVML's spelling is the same bus
        ({"numa_node": 1}, _pair(_UP), {"numa_node"}),
        ({"numa_node": 1}, _pair(_UP, numa=None), set()),  # the host cannot say: a warning in both
        ({"nvlink_peers": (UUID1,)}, _pair(_DOWN), {"nvlink_peer"}),
        ({"nvlink_peers": ("GPU-11111111-2222-3333-4444-555555555555",)}, _pair(_UP), {"nvlink_peer"}),
        ({"nvlink_peers": (UUID1,)}, _pair(()), set()),  # no link facts: unknown, not a mismatch
    ],
)
def test_plan_and_validate_find_the_same_mismatches(
    spec: dict[str, object], topology: Topology, mismatched: set[str]
) -> None:
    gpus = (config_module.GpuSpec(uuid=UUID0, **spec), config_module.GpuSpec(uuid=UUID1))  # type: ignore[arg-type]
    cfg = Config(nodes=(NodeSpec(name="n0", gpus=gpus),))
    results = run_checks(cfg, topology, "n0", numactl_path=None)
    failed = {r.name for r in results if r.status == "fail" and r.name in ("bus_id", "numa_node", "nvlink_peer")}
    assert failed == mismatched, results
    options = PlanOptions(entry=Entry("script", "t.py"), numactl=None)
    if mismatched:
        with pytest.raises(TopologyError) as info:
            build_plan(cfg, topology, CONTEXT, options)
        assert str(info.value).count("cluster.nodes[0].gpus[0]") == len(mismatched)
    else:
        build_plan(cfg, topology, CONTEXT, options)
