"""build_plan on hand-built configs and topologies (no hardware, no config files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from guards import GUARD_S

from openclaw_launch.config.model import Config, GpuSpec, NodeSpec, Runtime
from openclaw_launch.errors import PlanError, TopologyError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import RunContext, run_context
from openclaw_launch.plan.env import common_env
from openclaw_launch.plan.format import format_plan_table
from openclaw_launch.plan.model import Entry, LaunchPlan, PlanOptions
from openclaw_launch.topology.cpulist import format_cpulist
from openclaw_launch.topology.model import GpuInfo, NvLink, Topology

NODE0 = tuple(range(0, 32)) + tuple(range(64, 96))
NODE1 = tuple(range(32, 64)) + tuple(range(96, 128))
TRAIN = Entry("script", "train.py", ("--epochs", "3"))
CONTEXT = run_context("r", "/tmp", None)  # a plan that is not run: no pid in its run directory


def uuid(i: int, host: int = 0) -> str:
    return f"GPU-{host:02x}{i:06x}-1111-2222-3333-444455556666"


def bus(i: int) -> str:
    return f"0000:{0x07 + 0x10 * i:02x}:00.0"


def dgx(allowed: tuple[int, ...] | None = None, host: int = 0, n: int = 8) -> Topology:
    """Two sockets, one NUMA node each, GPUs 0-3 on node 0 and 4-7 on node 1; cpu i and i+64 are siblings."""
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=uuid(i, host),
            pci_bus_id=bus(i),
            name="A100",
            numa_node=0 if i < 4 else 1,
            cpu_affinity=NODE0 if i < 4 else NODE1,
        )
        for i in range(n)
    )
    return Topology(
        gpus=gpus,
        numa_nodes={0: NODE0, 1: NODE1},
        allowed_cpus=allowed if allowed is not None else tuple(range(128)),
        core_of={c: c % 64 for c in range(128)},
        socket_of={c: 0 if c % 64 < 32 else 1 for c in range(128)},
        links={(i, j): "NV12" for i in range(n) for j in range(n) if i != j},
        source="test:dgx",
    )


def h200() -> Topology:
    """The measured 2x H200 host: sysfs numa_node -1, affinity 0-31, one NUMA node."""
    gpus = tuple(
        GpuInfo(index=i, uuid=uuid(i, 0xAA), pci_bus_id=bus(i), cpu_affinity=tuple(range(32))) for i in range(2)
    )
    return Topology(
        gpus=gpus,
        numa_nodes={0: tuple(range(32))},
        allowed_cpus=tuple(range(32)),
        links={(0, 1): "NV18", (1, 0): "NV18"},
        source="test:h200",
    )


def node_from(topo: Topology, name: str = "n0", ip: str | None = "10.0.0.1", count: int | None = None) -> NodeSpec:
    gpus = topo.gpus[:count] if count is not None else topo.gpus
    specs = tuple(GpuSpec(uuid=g.uuid or "", numa_node=g.numa_node, pci_bus_id=g.pci_bus_id) for g in gpus)
    return NodeSpec(name=name, ip=ip, gpus=specs)


def config(*nodes: NodeSpec, **runtime: object) -> Config:
    return Config(nodes=nodes, runtime=Runtime(**runtime), source="test.yaml")  # type: ignore[arg-type]


def plan_for(cfg: Config, topo: Topology, context: RunContext | None = None, **opts: object) -> LaunchPlan:
    opts.setdefault("entry", TRAIN)
    return build_plan(cfg, topo, context or CONTEXT, PlanOptions(**opts))  # type: ignore[arg-type]


def test_node_policy_on_two_socket_host() -> None:
    topo = dgx()
    plan = plan_for(config(node_from(topo)), topo, run_context("job7", "/tmp", 1), python="/usr/bin/python3")
    assert (plan.world_size, plan.nnodes, plan.backend, plan.mps) == (8, 1, "nccl", None)
    for r in plan.ranks:
        numa = 0 if r.rank < 4 else 1
        assert r.local_rank == r.rank and r.gpu_uuid == uuid(r.rank) and r.pci_bus_id == bus(r.rank)
        assert r.numa_node == numa and r.cpus == (NODE0 if numa == 0 else NODE1)
        assert r.mem_policy == "bind" and r.mem_nodes == (numa,)
        assert list(r.argv) == [
            "numactl",
            f"--cpunodebind={numa}",
            f"--membind={numa}",
            "/usr/bin/python3",
            "-u",
            "train.py",
            "--epochs",
            "3",
        ]
        assert r.env["OMP_NUM_THREADS"] == "8", "32 cores shared by 4 ranks"
        assert r.env["TORCHELASTIC_RUN_ID"] == "job7"
    assert plan.warnings == ()


def test_narrow_cpuset_uses_physcpubind() -> None:
    allowed = tuple(range(0, 8)) + tuple(range(64, 72)) + tuple(range(32, 40)) + tuple(range(96, 104))
    topo = dgx(allowed=allowed)
    plan = plan_for(config(node_from(topo)), topo)
    assert plan.ranks[0].argv[:3] == ("numactl", "--physcpubind=0-7,64-71", "--membind=0")
    assert plan.ranks[7].argv[:3] == ("numactl", "--physcpubind=32-39,96-103", "--membind=1")


def test_exclusive_gives_disjoint_whole_cores_on_the_gpus_node() -> None:
    topo = dgx()
    plan = plan_for(config(node_from(topo), binding="exclusive"), topo)
    used: set[int] = set()
    for r in plan.ranks:
        assert len(r.cpus) == 16 and all((c + 64) % 128 in r.cpus for c in r.cpus)
        assert set(r.cpus) <= set(NODE0 if r.rank < 4 else NODE1) and not used & set(r.cpus)
        used |= set(r.cpus)
        assert r.env["OMP_NUM_THREADS"] == "8"
    assert plan.ranks[1].argv[:3] == ("numactl", "--physcpubind=8-15,72-79", "--membind=0")


def test_exclusive_with_more_gpus_than_cores_fails_clearly() -> None:
    topo = dgx(allowed=(0, 1, 64, 65) + NODE1)
    with pytest.raises(PlanError) as e:
        plan_for(config(node_from(topo), binding="exclusive"), topo)
    assert "2 allowed core(s) for 4 worker(s)" in str(e.value) and "binding: node" in str(e.value)


def test_h200_host_without_numa_info() -> None:
    topo = h200()
    cfg = config(replace(node_from(topo), gpus=tuple(replace(g, numa_node=None) for g in node_from(topo).gpus)))
    plan = plan_for(cfg, topo)
    for r in plan.ranks:
        assert r.numa_node is None and r.cpus == tuple(range(32)) and r.mem_nodes == ()
        assert r.argv[:2] == ("numactl", "--physcpubind=0-31") and r.argv[2] == "python3"
        assert r.env["OPENCLAW_NUMA_NODE"] == ""
    assert sum("no NUMA information" in w for w in plan.warnings) == 1
    halves = plan_for(replace(cfg, runtime=Runtime(binding="exclusive")), topo)
    assert [r.cpus for r in halves.ranks] == [tuple(range(16)), tuple(range(16, 32))]


def test_config_numa_used_when_host_has_none_with_a_warning() -> None:
    topo = h200()
    cfg = config(replace(node_from(topo), gpus=tuple(replace(g, numa_node=0) for g in node_from(topo).gpus)))
    plan = plan_for(cfg, topo)
    assert plan.ranks[0].numa_node == 0 and plan.ranks[0].argv[:3] == ("numactl", "--cpunodebind=0", "--membind=0")
    assert any("no NUMA information" in w and "numa_node 0" in w for w in plan.warnings)


def test_missing_uuid_lists_the_gpus_that_are_there() -> None:
    topo = dgx(n=2)
    node = node_from(topo)
    bad = replace(node, gpus=(node.gpus[0], GpuSpec(uuid="GPU-deadbeef-0000-0000-0000-000000000000", line=14)))
    with pytest.raises(TopologyError) as e:
        plan_for(config(bad), topo)
    msg = str(e.value)
    assert "cluster.nodes[0].gpus[1] (line 14): GPU-deadbeef" in msg
    assert uuid(0) in msg and uuid(1) in msg and bus(1) in msg
    assert "openclaw-launch discover" in msg


def test_uuid_match_is_case_insensitive_and_uses_the_hosts_spelling() -> None:
    topo = dgx(n=1)
    node = NodeSpec(name="n0", gpus=(GpuSpec(uuid=uuid(0).upper()),))
    assert plan_for(config(node), topo).ranks[0].gpu_uuid == uuid(0)


def mismatched(topo: Topology) -> NodeSpec:
    """GPU 0 configured with the wrong bus id and NUMA node; GPU 1 expects an NVLink to GPU 2 that is PCIe."""
    specs = node_from(topo, count=3).gpus
    return NodeSpec(
        name="n0",
        gpus=(
            replace(specs[0], pci_bus_id="0000:99:00.0", numa_node=1),
            replace(specs[1], nvlink_peers=(uuid(2),)),
            specs[2],
        ),
    )


def pcie_between_1_and_2(topo: Topology) -> Topology:
    links = dict(topo.links)
    links[(1, 2)] = links[(2, 1)] = "SYS"
    return replace(topo, links=links)


def test_strictness_fail_reports_every_mismatch() -> None:
    topo = pcie_between_1_and_2(dgx(n=3))
    with pytest.raises(TopologyError) as e:
        plan_for(config(mismatched(topo)), topo)
    msg = str(e.value)
    assert "pci_bus_id is 0000:99:00.0 in the config" in msg and bus(0) in msg
    assert "numa_node is 1 in the config" in msg and "NUMA node 0" in msg
    assert "not NVLinked" in msg and "SYS" in msg
    assert "strictness: warn" in msg


def test_strictness_warn_plans_with_what_was_found() -> None:
    topo = pcie_between_1_and_2(dgx(n=3))
    plan = plan_for(config(mismatched(topo)), topo, strictness="warn")
    assert len(plan.warnings) == 3 and plan.ranks[0].numa_node == 0  # sysfs wins
    plan = plan_for(config(mismatched(topo), strictness="warn"), topo)
    assert len(plan.warnings) == 3
    with pytest.raises(TopologyError):
        plan_for(config(mismatched(topo), strictness="warn"), topo, strictness="fail")


def test_nvlink_peer_seen_through_nvml_links() -> None:
    topo = dgx(n=2)
    g0 = replace(topo.gpus[0], nvlinks=(NvLink(0, True, bus(1)),))
    topo = replace(topo, gpus=(g0, topo.gpus[1]), links={})
    node = node_from(topo)
    node = replace(node, gpus=(replace(node.gpus[0], nvlink_peers=(uuid(1),)), node.gpus[1]))
    assert plan_for(config(node), topo).warnings == ()


def two_node_config(**runtime: object) -> tuple[Config, Topology, Topology]:
    ta, tb = dgx(n=2, host=1), dgx(n=3, host=2)
    cfg = config(node_from(ta, "a", "10.0.0.1"), node_from(tb, "b", "10.0.0.2"), **runtime)
    return cfg, ta, tb


def test_two_nodes_with_different_gpu_counts() -> None:
    cfg, ta, tb = two_node_config(nccl_socket_nthreads=8, nccl_nthreads=4, nccl_env={"NCCL_IB_HCA": "mlx5"})
    a, b = plan_for(cfg, ta, node="a"), plan_for(cfg, tb, node="b")
    assert [r.rank for r in a.ranks] == [0, 1] and [r.rank for r in b.ranks] == [2, 3, 4]
    assert b.node_rank == 1 and b.world_size == a.world_size == 5 and b.nnodes == 2
    for r in b.ranks:
        assert r.env["GROUP_RANK"] == "1" and r.env["GROUP_WORLD_SIZE"] == "2"
        assert r.env["LOCAL_WORLD_SIZE"] == "3" and r.env["WORLD_SIZE"] == "5"
        assert r.env["RANK"] == str(r.rank) and r.env["LOCAL_RANK"] == str(r.local_rank)
    assert a.master_addr == b.master_addr == "10.0.0.1" and a.master_port == 29500
    common = common_env(a)
    assert common == common_env(b)
    assert common["NCCL_SOCKET_NTHREADS"] == "8" and common["NCCL_NTHREADS"] == "4"
    assert common["NCCL_IB_HCA"] == "mlx5" and "RANK" not in common and "OMP_NUM_THREADS" not in common
    nccl = [{k: v for k, v in r.env.items() if k.startswith("NCCL_")} for r in a.ranks + b.ranks]
    assert all(n == nccl[0] for n in nccl)


def test_node_must_be_named_when_there_are_several() -> None:
    cfg, ta, _ = two_node_config()
    with pytest.raises(PlanError, match=r"\(a, b\).*--node"):
        plan_for(cfg, ta)
    with pytest.raises(PlanError, match="the config has: a, b"):
        plan_for(cfg, ta, node="c")


def test_master_address_and_port_precedence() -> None:
    cfg, ta, _ = two_node_config(master_addr="head", master_port=1234)
    plan = plan_for(cfg, ta, node="a", master_port=4321)
    assert (plan.master_addr, plan.master_port) == ("head", 4321)
    plan = plan_for(cfg, ta, node="a", master_addr="cli-head")
    assert (plan.master_addr, plan.master_port) == ("cli-head", 1234)
    lonely = config(NodeSpec(name="x", gpus=node_from(ta).gpus))
    assert plan_for(lonely, ta).master_addr == "127.0.0.1"


def test_omp_num_threads_left_to_the_user() -> None:
    topo = dgx(n=1)
    plan = plan_for(config(node_from(topo)), topo, base_env={"OMP_NUM_THREADS": "6"})
    assert "OMP_NUM_THREADS" not in plan.ranks[0].env
    plan = plan_for(config(node_from(topo), env={"OMP_NUM_THREADS": "2"}), topo)
    assert plan.ranks[0].env["OMP_NUM_THREADS"] == "2"


NASTY = "$(touch /tmp/openclaw-pwned); rm -rf / ; echo 'single' \"double\"\nsecond line `id`"


def test_config_values_reach_env_and_argv_literally() -> None:
    topo = dgx(n=2)
    cfg = config(node_from(topo), env={"USER_VAR": NASTY}, nccl_env={"NCCL_DEBUG_SUBSYS": NASTY})
    plan = plan_for(cfg, topo, entry=Entry("script", "my script;.py", (NASTY, "--x=$HOME")))
    for r in plan.ranks:
        assert r.env["USER_VAR"] == NASTY and r.env["NCCL_DEBUG_SUBSYS"] == NASTY
        assert r.argv[-3:] == ("my script;.py", NASTY, "--x=$HOME")
    json.dumps(plan.to_json())  # serialisable as-is


def test_entry_kinds() -> None:
    topo = dgx(n=1)
    cfg = config(node_from(topo))
    mod = plan_for(cfg, topo, entry=Entry("module", "pkg.train", ("-v",)), python="py")
    assert mod.ranks[0].argv[3:] == ("py", "-u", "-m", "pkg.train", "-v")
    exe = plan_for(cfg, topo, entry=Entry("exec", "/bin/echo", ("hi",)))
    assert exe.ranks[0].argv[3:] == ("/bin/echo", "hi")


def test_cpu_workers_spread_over_cores() -> None:
    topo = dgx(n=0)
    cfg = config(NodeSpec(name="cpu", cpu_workers=4))
    plan = plan_for(cfg, topo)
    assert plan.backend == "gloo" and plan.mps is None and plan.world_size == 4
    used: set[int] = set()
    for r in plan.ranks:
        assert r.gpu_uuid is None and "CUDA_VISIBLE_DEVICES" not in r.env and r.env["OPENCLAW_BACKEND"] == "gloo"
        assert len(r.cpus) == 32 and not used & set(r.cpus) and r.env["OMP_NUM_THREADS"] == "16"
        used |= set(r.cpus)
    assert [r.numa_node for r in plan.ranks] == [0, 0, 1, 1]
    assert plan.ranks[0].argv[:3] == ("numactl", "--physcpubind=0-15,64-79", "--membind=0")


def test_cpu_workers_share_when_cores_run_out() -> None:
    topo = Topology(numa_nodes={0: (0, 1)}, allowed_cpus=(0, 1), source="test:tiny")
    plan = plan_for(config(NodeSpec(name="cpu", cpu_workers=3)), topo)
    assert all(r.cpus == (0, 1) for r in plan.ranks)
    assert any("3 CPU workers but only 2 cores" in w for w in plan.warnings)


def test_ordered_and_isolated_visible_devices() -> None:
    topo = dgx(n=4)
    ordered = plan_for(config(node_from(topo)), topo)
    all_uuids = ",".join(uuid(i) for i in range(4))
    for r in ordered.ranks:
        assert r.env["CUDA_VISIBLE_DEVICES"] == all_uuids
        assert r.env["CUDA_VISIBLE_DEVICES"].split(",")[r.local_rank] == r.gpu_uuid
        assert r.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    isolated = plan_for(config(node_from(topo), visible_devices="isolated"), topo)
    for r in isolated.ranks:
        assert r.env["CUDA_VISIBLE_DEVICES"] == r.gpu_uuid and r.env["OPENCLAW_CUDA_DEVICE_INDEX"] == "0"


def test_two_procs_per_gpu_with_mps() -> None:
    topo = dgx(n=2)
    cfg = config(node_from(topo), enable_mps=True, procs_per_gpu=2, mps_max_clients_per_gpu=2)
    plan = plan_for(cfg, topo)
    assert plan.world_size == 4 and len(plan.ranks) == 4
    assert [r.gpu_uuid for r in plan.ranks] == [uuid(0), uuid(0), uuid(1), uuid(1)]
    assert [r.env["OPENCLAW_CUDA_DEVICE_INDEX"] for r in plan.ranks] == ["0", "0", "1", "1"]
    assert all(r.env["CUDA_VISIBLE_DEVICES"] == f"{uuid(0)},{uuid(1)}" for r in plan.ranks)
    assert plan.mps is not None and plan.mps.gpu_uuids == (uuid(0), uuid(1)) and plan.mps.max_clients_per_gpu == 2
    assert any("OPENCLAW_CUDA_DEVICE_INDEX" in w for w in plan.warnings)
    exclusive = plan_for(replace(cfg, runtime=replace(cfg.runtime, binding="exclusive")), topo)
    assert [len(r.cpus) for r in exclusive.ranks] == [16, 16, 16, 16]
    with pytest.raises(PlanError, match="enable_mps"):
        plan_for(config(node_from(topo), procs_per_gpu=2), topo)


def test_without_numactl_or_with_binding_none_there_is_no_prefix() -> None:
    topo = dgx(n=1)
    plan = plan_for(config(node_from(topo)), topo, numactl=None)
    assert plan.ranks[0].argv[0] == "python3" and any("numactl is not installed" in w for w in plan.warnings)
    plan = plan_for(config(node_from(topo), binding="none"), topo)
    r = plan.ranks[0]
    assert r.argv[0] == "python3" and r.mem_policy == "none" and r.cpus == tuple(range(128))
    assert plan.warnings == ()


def test_without_numactl_the_plan_claims_no_binding_it_cannot_apply() -> None:
    """No numactl: run starts the workers unbound, so the plan says mem_policy none and all allowed CPUs
    (the supervisor's read-back then agrees with it), whatever binding/mem_policy the config asks."""
    topo = dgx(n=2)
    for binding in ("node", "exclusive", "socket"):
        plan = plan_for(config(node_from(topo), binding=binding, mem_policy="bind"), topo, numactl=None)
        for r in plan.ranks:
            assert (r.mem_policy, r.mem_nodes, r.cpus, r.argv[0]) == ("none", (), tuple(range(128)), "python3")
        assert sum("numactl is not installed: binding" in w for w in plan.warnings) == 1


def test_memory_policies_in_argv() -> None:
    topo = dgx(n=1)
    for policy, flag in (("preferred", "--preferred=0"), ("local", "--localalloc")):
        assert plan_for(config(node_from(topo), mem_policy=policy), topo).ranks[0].argv[2] == flag
    assert plan_for(config(node_from(topo), mem_policy="none"), topo).ranks[0].argv[2] == "python3"


def test_plan_is_deterministic_and_printable() -> None:
    topo = dgx()
    cfg = config(node_from(topo), binding="exclusive", nccl_env={"NCCL_ALGO": "Ring"})
    kept = run_context("j", "/tmp", 7, log_dir="/logs")
    first, second = plan_for(cfg, topo, kept), plan_for(cfg, topo, kept)
    assert json.dumps(first.to_json()) == json.dumps(second.to_json())
    assert first.ranks[3].env["TORCHELASTIC_ERROR_FILE"] == "/logs/j/errors/attempt-0/rank-3/error.json"  # kept
    assert (
        plan_for(cfg, topo).ranks[3].env["TORCHELASTIC_ERROR_FILE"]
        == "/tmp/openclaw-r-<pid>/errors/attempt-0/rank-3/error.json"
    )
    lines = format_plan_table(plan_for(cfg, topo)).splitlines()
    assert lines[1].split()[:8] == ["rank", "local", "node", "gpu", "bus", "numa", "cpus", "mem"]
    assert lines[2].split()[:8] == ["0", "0", "n0", "0:GPU-00000000", bus(0), "0", "0-7,64-71", "bind:0"]
    lines = format_plan_table(plan_for(cfg, topo, numactl=None)).splitlines()
    assert lines[2].split()[:8] == ["0", "0", "n0", "0:GPU-00000000", bus(0), "0", "0-127", "none"]
    assert lines[-1].startswith("warning: numactl is not installed")
    assert "warning" not in format_plan_table(plan_for(cfg, topo, numactl=None), warnings=False)


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")
def test_planned_argv_and_env_run_as_planned() -> None:
    """A real worker started from the plan is bound where planned and sees the config's values literally."""
    cpus = tuple(sorted(os.sched_getaffinity(0)))
    topo = Topology(numa_nodes={0: cpus}, allowed_cpus=cpus, source="test:this-box")
    cfg = config(NodeSpec(name="here", cpu_workers=1), env={"USER_VAR": NASTY}, mem_policy="local")
    code = "import os, sys; print(sorted(os.sched_getaffinity(0))); print(repr(os.environ['USER_VAR']))"
    entry = Entry("exec", sys.executable, ("-c", code + "; print(sys.argv[1:])", NASTY))
    numactl = shutil.which("numactl")
    plan = plan_for(cfg, topo, entry=entry, numactl=numactl)
    argv = list(plan.ranks[0].argv)
    assert argv[:3] == [numactl, f"--physcpubind={format_cpulist(cpus)}", "--localalloc"]
    out = subprocess.run(argv, env={**os.environ, **plan.ranks[0].env}, capture_output=True, text=True, timeout=GUARD_S)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == [str(list(cpus)), repr(NASTY), str([NASTY])]


def test_every_plan_json_field_is_documented() -> None:
    """docs/plan-format.md is what other tools read: a field added here must be added there."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "plan-format.md").read_text()
    topo = dgx(n=2)
    cfg = config(node_from(topo), enable_mps=True, mps_max_clients_per_gpu=1)
    doc_json = plan_for(cfg, topo).to_json()
    rank = doc_json["ranks"][0]  # type: ignore[index]
    assert doc_json["schema"] == 1
    mps = doc_json["mps"]
    assert isinstance(mps, dict)
    for key in [*doc_json, *rank, *mps]:
        assert f"`{key}`" in doc, key
    assert {
        "rank",
        "local_rank",
        "node",
        "gpu_uuid",
        "pci_bus_id",
        "numa_node",
        "cpus",
        "mem_policy",
        "argv",
        "env",
    } <= rank.keys()


def test_torchrun_nnodes_without_config_is_one_world_of_identical_hosts() -> None:
    """--nnodes 3 --node-rank 2 --nproc-per-node 2: ranks 4, 5 of 6, GROUP_RANK 2, the port fixed."""
    from openclaw_launch.config.discover import host_config

    topo = dgx()
    config = host_config(topo, 2, nnodes=3)
    options = PlanOptions(entry=Entry("script", "t.py"), node="node2", master_addr="head")
    plan = build_plan(config, topo, run_context("none", "/tmp", 1, free_master_port=4242), options)
    assert [r.rank for r in plan.ranks] == [4, 5] and plan.world_size == 6 and plan.nnodes == 3
    assert {r.env["GROUP_RANK"] for r in plan.ranks} == {"2"} and plan.master_port == 29500


def test_several_nodes_without_any_address_is_an_error_not_127_0_0_1() -> None:
    """Each node would meet at its own 127.0.0.1 and wait for itself; Slurm's first host is the fallback."""
    from openclaw_launch.config.discover import host_config

    topo = dgx()
    config = host_config(topo, 2, nnodes=2)
    options = PlanOptions(entry=Entry("script", "t.py"), node="node1")
    with pytest.raises(PlanError, match=r"2 nodes but no address for the first node \(node0\).*--master-addr"):
        build_plan(config, topo, CONTEXT, options)
    slurm = replace(options, fallback_master_addr="gpu-a01")
    assert build_plan(config, topo, CONTEXT, slurm).master_addr == "gpu-a01"


def test_one_node_job_takes_the_free_port_unless_one_is_given() -> None:
    from openclaw_launch.config.discover import host_config

    topo = dgx()
    config = host_config(topo, 2)
    entry = Entry("script", "t.py")
    free = run_context("r", "/tmp", 1, free_master_port=4242)
    assert build_plan(config, topo, free, PlanOptions(entry=entry)).master_port == 4242
    shell_port = PlanOptions(entry=entry, base_env={"MASTER_PORT": "5000"})  # ignored, as by torchrun, and said
    ignored = build_plan(config, topo, free, shell_port)
    assert ignored.master_port == 4242 and any("MASTER_PORT=5000" in w for w in ignored.warnings)
    port_0 = PlanOptions(entry=entry, master_port=0)  # torchrun's port 0: the free one
    assert build_plan(config, topo, free, port_0).master_port == 4242
    given = PlanOptions(entry=entry, master_port=6000, base_env={"MASTER_PORT": "5000"})
    assert build_plan(config, topo, free, given).master_port == 6000
    # a plan made before the run (``plan``, ``--dry-run``) cannot know the port: a documented placeholder
    preview = build_plan(config, topo, CONTEXT, PlanOptions(entry=entry))
    assert preview.master_port is None and {r.env["MASTER_PORT"] for r in preview.ranks} == {"<free-port>"}
