"""CPU/memory binding policies and the numactl argv, on hand-built topologies."""

from __future__ import annotations

import pytest

from openclaw_launch.errors import PlanError
from openclaw_launch.plan.binding import (
    Slot,
    allowed_cpus,
    bind_cpu_workers,
    bind_gpu_workers,
    core_count,
    cores_of,
    numactl_argv,
)
from openclaw_launch.topology.model import GpuInfo, Topology


def two_socket(allowed: tuple[int, ...] | None = None, nodes_per_socket: int = 1) -> Topology:
    """128 CPUs, 64 cores (cpu i and i+64 are siblings), 2 sockets; 1 or 2 NUMA nodes per socket."""
    per_node = 64 // (2 * nodes_per_socket)
    numa = {
        n: tuple(range(n * per_node, (n + 1) * per_node)) + tuple(range(64 + n * per_node, 64 + (n + 1) * per_node))
        for n in range(2 * nodes_per_socket)
    }
    return Topology(
        gpus=tuple(GpuInfo(index=i, uuid=f"GPU-{i}") for i in range(8)),
        numa_nodes=numa,
        allowed_cpus=allowed if allowed is not None else tuple(range(128)),
        core_of={c: c % 64 for c in range(128)},
        socket_of={c: 0 if c % 64 < 32 else 1 for c in range(128)},
    )


def slots(topo: Topology, numa: list[int | None]) -> list[Slot]:
    return [Slot(f"GPU {i}", topo.gpus[i], n) for i, n in enumerate(numa)]


def siblings_together(cpus: tuple[int, ...]) -> bool:
    return all((c + 64) % 128 in cpus for c in cpus)


def test_node_policy_whole_node_uses_cpunodebind() -> None:
    topo = two_socket()
    res = bind_gpu_workers(topo, slots(topo, [0, 0, 1, 1]), "node")
    b0, _, b2, _ = res.bindings
    assert b0.cpus == topo.numa_nodes[0] and b0.cpu_nodes == (0,) and b0.mem_nodes == (0,)
    assert b2.cpus == topo.numa_nodes[1] and b2.cpu_nodes == (1,)
    assert numactl_argv(b0.cpus, "bind", b0.mem_nodes, "numactl", b0.cpu_nodes) == [
        "numactl",
        "--cpunodebind=0",
        "--membind=0",
    ]
    assert res.warnings == ()


def test_node_policy_narrow_cpuset_uses_physcpubind() -> None:
    topo = two_socket(allowed=tuple(range(0, 8)) + tuple(range(64, 72)) + tuple(range(32, 64)))
    b0, b1 = bind_gpu_workers(topo, slots(topo, [0, 1]), "node").bindings
    assert b0.cpus == tuple(range(0, 8)) + tuple(range(64, 72)) and b0.cpu_nodes == ()
    assert numactl_argv(b0.cpus, "bind", b0.mem_nodes, "/usr/bin/numactl", b0.cpu_nodes) == [
        "/usr/bin/numactl",
        "--physcpubind=0-7,64-71",
        "--membind=0",
    ]
    assert b1.cpus == tuple(range(32, 64))


def test_exclusive_splits_whole_cores_disjointly() -> None:
    topo = two_socket()
    res = bind_gpu_workers(topo, slots(topo, [0, 0, 0, 0, 1, 1, 1, 1]), "exclusive")
    seen: set[int] = set()
    for i, b in enumerate(res.bindings):
        assert len(b.cpus) == 16 and core_count(topo, b.cpus) == 8
        assert siblings_together(b.cpus)
        assert set(b.cpus) <= set(topo.numa_nodes[i // 4])
        assert not seen & set(b.cpus)
        seen |= set(b.cpus)
        assert b.mem_nodes == (i // 4,)
    assert res.bindings[0].cpus == tuple(range(0, 8)) + tuple(range(64, 72))
    assert res.bindings[4].cpus == tuple(range(32, 40)) + tuple(range(96, 104))


def test_exclusive_uneven_split_is_as_even_as_possible() -> None:
    topo = two_socket(allowed=tuple(range(0, 7)) + tuple(range(64, 71)))  # 7 cores on node 0
    res = bind_gpu_workers(topo, slots(topo, [0, 0, 0]), "exclusive")
    assert [core_count(topo, b.cpus) for b in res.bindings] == [3, 2, 2]
    assert res.bindings[0].cpus == (0, 1, 2, 64, 65, 66)


def test_exclusive_more_workers_than_cores_is_a_plan_error() -> None:
    topo = two_socket(allowed=(0, 1, 2, 64, 65, 66))
    with pytest.raises(PlanError) as e:
        bind_gpu_workers(topo, slots(topo, [0, 0, 0, 0]), "exclusive")
    msg = str(e.value)
    assert "3 allowed core(s) for 4 worker(s)" in msg and "binding: node" in msg and "NUMA node 0" in msg
    assert "only 6 of its 64 CPUs are allowed to this launcher by its cgroup/Slurm cpuset" in msg
    whole_node = two_socket()
    with pytest.raises(PlanError) as whole:  # the whole node allowed: no cpuset talk
        bind_gpu_workers(whole_node, [Slot("GPU 0", whole_node.gpus[0], 0)] * 33, "exclusive")
    assert "32 allowed core(s) for 33 worker(s)" in str(whole.value) and "cpuset" not in str(whole.value)


def test_socket_policy_covers_all_numa_nodes_of_the_socket() -> None:
    topo = two_socket(nodes_per_socket=2)
    b0, b3 = bind_gpu_workers(topo, slots(topo, [1, 3]), "socket").bindings
    assert b0.cpus == tuple(range(0, 32)) + tuple(range(64, 96))
    assert b0.mem_nodes == (0, 1) and b0.cpu_nodes == (0, 1)
    assert b3.mem_nodes == (2, 3)
    assert numactl_argv(b0.cpus, "preferred", b0.mem_nodes, "numactl", b0.cpu_nodes) == [
        "numactl",
        "--cpunodebind=0,1",
        "--preferred=0",
    ]


def test_socket_policy_without_socket_info_says_what_to_do() -> None:
    topo = Topology(gpus=(GpuInfo(0, "GPU-0"),), numa_nodes={0: (0, 1)}, allowed_cpus=(0, 1))
    with pytest.raises(PlanError, match="binding: node"):
        bind_gpu_workers(topo, slots(topo, [0]), "socket")


def test_explicit_cpus_are_cut_to_allowed_and_empty_is_an_error() -> None:
    topo = two_socket(allowed=tuple(range(0, 16)))
    slot = Slot("GPU 0", topo.gpus[0], 0, explicit_cpus=(4, 5, 6, 40))
    res = bind_gpu_workers(topo, [slot], "explicit")
    (b,) = res.bindings
    assert b.cpus == (4, 5, 6) and b.mem_nodes == (0,) and b.cpu_nodes == ()
    assert res.warnings == (
        "GPU 0: configured cpus 40 are not allowed to this launcher (allowed: 0-15, "
        "cgroup/Slurm cpuset); its worker runs on 4-6",
    )
    with pytest.raises(PlanError, match="none of its configured cpus"):
        bind_gpu_workers(topo, [Slot("GPU 0", topo.gpus[0], 0, explicit_cpus=(40, 41))], "explicit")


def test_none_policy_gives_all_allowed_cpus_and_no_binding() -> None:
    topo = two_socket(allowed=(0, 1, 2))
    (b,) = bind_gpu_workers(topo, slots(topo, [0]), "none").bindings
    assert b.cpus == (0, 1, 2) and not b.applied and b.mem_nodes == ()


def test_gpu_without_numa_info_uses_its_affinity_and_warns_once() -> None:
    gpus = tuple(GpuInfo(i, f"GPU-{i}", cpu_affinity=tuple(range(32))) for i in range(2))
    topo = Topology(gpus=gpus, numa_nodes={0: tuple(range(32))}, allowed_cpus=tuple(range(32)))
    res = bind_gpu_workers(topo, slots(topo, [None, None]), "node")
    assert all(b.cpus == tuple(range(32)) and b.mem_nodes == () and b.cpu_nodes == () for b in res.bindings)
    assert len(res.warnings) == 1 and "no NUMA information" in res.warnings[0]
    b = res.bindings[0]
    assert numactl_argv(b.cpus, "bind", b.mem_nodes, "numactl", b.cpu_nodes) == ["numactl", "--physcpubind=0-31"]
    halves = bind_gpu_workers(topo, slots(topo, [None, None]), "exclusive").bindings
    assert [b.cpus for b in halves] == [tuple(range(16)), tuple(range(16, 32))]


def test_gpu_whose_local_cpus_are_not_allowed_falls_back_with_a_warning() -> None:
    topo = two_socket(allowed=tuple(range(32, 64)))
    res = bind_gpu_workers(topo, slots(topo, [0]), "node")
    assert res.bindings[0].cpus == tuple(range(32, 64)) and "crosses the socket link" in res.warnings[0]


def test_cpu_workers_get_their_own_whole_cores() -> None:
    topo = two_socket()
    res = bind_cpu_workers(topo, 4, "node")
    assert [core_count(topo, b.cpus) for b in res.bindings] == [16] * 4
    assert [b.mem_nodes for b in res.bindings] == [(0,), (0,), (1,), (1,)]
    assert all(siblings_together(b.cpus) for b in res.bindings)
    assert len({c for b in res.bindings for c in b.cpus}) == 128 and res.warnings == ()


def test_cpu_workers_beyond_cores_share_all_cpus_with_a_warning() -> None:
    topo = Topology(numa_nodes={0: (0, 1)}, allowed_cpus=(0, 1))
    res = bind_cpu_workers(topo, 3, "exclusive")
    assert all(b.cpus == (0, 1) and b.mem_nodes == (0,) for b in res.bindings)
    assert "3 CPU workers but only 2 cores" in res.warnings[0]


def test_memory_policies() -> None:
    assert numactl_argv((0, 1), "bind", (0, 1), "numactl") == ["numactl", "--physcpubind=0-1", "--membind=0,1"]
    assert numactl_argv((0,), "preferred", (1,), "numactl") == ["numactl", "--physcpubind=0", "--preferred=1"]
    assert numactl_argv((0,), "local", (1,), "numactl") == ["numactl", "--physcpubind=0", "--localalloc"]
    assert numactl_argv((0,), "none", (1,), "numactl") == ["numactl", "--physcpubind=0"]
    assert numactl_argv((), "none", (), "numactl") == []


def test_topology_without_allowed_set_allows_every_known_cpu() -> None:
    topo = Topology(gpus=(GpuInfo(0, "GPU-0", cpu_affinity=(0, 1, 2, 3)),), numa_nodes={1: (4, 5)})
    assert allowed_cpus(topo) == (0, 1, 2, 3, 4, 5)
    assert cores_of(topo, (3, 1)) == [(1,), (3,)]
    with pytest.raises(PlanError, match="binding: none"):
        bind_cpu_workers(Topology(), 2, "node")
    assert bind_cpu_workers(Topology(), 2, "none").bindings[0].cpus == ()
