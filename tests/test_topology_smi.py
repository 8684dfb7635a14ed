from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from topo_helpers import H200_DIR, load_recorded, recorded_names, recorded_texts

from openclaw_launch.errors import TopologyError
from openclaw_launch.topology.cpulist import format_cpulist, parse_cpulist
from openclaw_launch.topology.smi import (
    infer_core_of,
    parse_lscpu,
    parse_numactl_hardware,
    parse_smi_list,
    parse_topo_matrix,
    topology_from_smi,
    topology_from_smi_files,
)


@dataclass(frozen=True)
class Expect:
    gpus: int
    numa: list[int | None]  # per GPU
    gpu0_cpus: str
    gpu0_nv_peers: int  # GPUs joined to GPU0 by NV#
    nodes: str  # NUMA nodes of the topology, comma-separated ("" = none known)
    links: dict[tuple[int, int], str]


def dgx_a100(nodes: str, links: dict[tuple[int, int], str]) -> Expect:
    return Expect(8, [3, 3, 1, 1, 7, 7, 5, 5], "48-63,176-191", 7, nodes, links)


EXPECT = {
    "h200x2": Expect(2, [0, 0], "0-31", 1, "0", {(0, 1): "NV18", (1, 0): "NV18"}),
    "01": dgx_a100("0,1,2,3,4,5,6,7", {(0, 7): "NV12"}),  # lscpu: NPS4, 8 nodes
    "02": dgx_a100("1,3,5,7", {(6, 7): "NV12"}),  # only the GPUs' nodes are known
    "03": Expect(8, [0, 0, 0, 0, 1, 1, 1, 1], "0-55,112-167", 7, "0,1", {(0, 7): "NV18"}),
    "04": Expect(4, [3, 2, 1, 0], "24-31,56-63", 3, "0,1,2,3", {(3, 0): "NV4"}),
    "05": Expect(4, [0, 0, 1, 1], "0,2,4,6,8,10", 0, "0,1", {(0, 1): "NODE", (0, 2): "SYS", (2, 3): "NODE"}),
    "06": Expect(4, [0, 0, 8, 8], "0-63", 1, "0,8", {(0, 1): "NV3", (1, 2): "SYS", (3, 2): "NV3"}),
    "07": Expect(4, [0, 0, 1, 1], "0-23", 3, "0,1", {(0, 3): "NV4"}),
    "08": Expect(2, [0, 1], "0-63", 0, "0,1", {(0, 1): "SYS"}),
    "09": Expect(8, [None] * 8, "0-11,24-35", 4, "", {(0, 1): "NV1", (0, 3): "NV2", (0, 5): "SYS"}),
    "10": Expect(4, [0, 0, 1, 1], "0-31", 0, "0,1", {(0, 1): "NODE", (1, 2): "SYS"}),
    "11": Expect(2, [0, 0], "0-23", 0, "0", {(0, 1): "PHB"}),
    "15": Expect(2, [None, None], "0-11", 0, "", {(1, 0): "PHB"}),
}


def _key(name: str) -> str:
    return name if name == "h200x2" else name.split("_")[0]


def test_every_recorded_file_has_expectations() -> None:
    assert sorted(_key(n) for n in recorded_names()) == sorted(EXPECT)


@pytest.mark.parametrize("name", recorded_names())
def test_recorded_topology(name: str) -> None:
    exp = EXPECT[_key(name)]
    topo = load_recorded(name)
    assert len(topo.gpus) == exp.gpus
    assert [g.index for g in topo.gpus] == list(range(exp.gpus))
    assert [g.numa_node for g in topo.gpus] == exp.numa
    assert format_cpulist(topo.gpus[0].cpu_affinity or ()) == exp.gpu0_cpus
    nv_peers = [j for (i, j), v in topo.links.items() if i == 0 and v.startswith("NV")]
    assert len(nv_peers) == exp.gpu0_nv_peers
    assert ",".join(str(n) for n in sorted(topo.numa_nodes)) == exp.nodes
    for pair, link in exp.links.items():
        assert topo.links[pair] == link


@pytest.mark.parametrize("name", recorded_names())
def test_recorded_topology_is_consistent(name: str) -> None:
    topo = load_recorded(name)
    n = len(topo.gpus)
    assert len(topo.links) == n * (n - 1)
    assert all(topo.links[(j, i)] == v for (i, j), v in topo.links.items())
    assert all(g.uuid and g.uuid.startswith("GPU-") for g in topo.gpus)
    assert len({g.uuid for g in topo.gpus}) == n
    for g in topo.gpus:
        assert g.cpu_affinity and set(g.cpu_affinity) <= set(topo.allowed_cpus)
        if g.numa_node is not None:  # the GPU's CPUs are on its node
            assert set(g.cpu_affinity) <= set(topo.numa_nodes[g.numa_node])
    assert set(topo.allowed_cpus) <= set(topo.core_of)
    assert all(topo.core_of[k] == k for k in topo.core_of.values())


def test_h200_uses_real_listing() -> None:
    topo = load_recorded("h200x2")
    assert [g.uuid for g in topo.gpus] == [
        "GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee",
        "GPU-593502f1-407a-3b77-45a0-032830195d52",
    ]
    assert [g.name for g in topo.gpus] == ["NVIDIA H200", "NVIDIA H200"]
    assert topo.socket_of == {c: 0 for c in range(32)}  # lscpu: Socket(s): 1
    assert all(topo.core_of[c] == c for c in range(32))  # lscpu: Thread(s) per core: 1
    assert topo.source == "smi:h200x2"


def test_h200_ansi_header_and_gpu_numa_column() -> None:
    parsed = parse_topo_matrix((H200_DIR / "nvidia-smi-topo-m.txt").read_text())
    assert parsed.devices == ("GPU0", "GPU1")
    assert parsed.affinity_columns == ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
    assert [(g.numa_affinity, g.gpu_numa_id) for g in parsed.gpus] == [(0, None), (0, None)]


def test_nic_columns_and_legend() -> None:
    parsed = parse_topo_matrix(recorded_texts("03")[0])
    assert parsed.devices[8:] == tuple(f"NIC{i}" for i in range(11))
    assert parsed.nic_names["NIC9"] == "mlx5_10"
    assert parsed.matrix[("GPU0", "NIC0")] == "PIX"
    assert parsed.matrix[("NIC10", "NIC9")] == "PIX"
    old = parse_topo_matrix(recorded_texts("02")[0])
    assert "mlx5_11" in old.devices and old.nic_names == {}


def test_no_numa_column_old_driver() -> None:
    parsed = parse_topo_matrix(recorded_texts("09")[0])
    assert parsed.affinity_columns == ("CPU Affinity",)
    assert parsed.matrix[("mlx5_0", "GPU2")] == "PIX"


def test_numa_affinity_na_with_double_tabs() -> None:
    parsed = parse_topo_matrix(recorded_texts("15")[0])
    assert [(g.numa_affinity, g.gpu_numa_id) for g in parsed.gpus] == [(None, None), (None, None)]
    assert parsed.gpus[1].cpu_affinity == tuple(range(12))


def test_interleaved_affinity_and_allowed_cpus() -> None:
    """adroit: numactl nodes hold 24 interleaved CPUs; nvidia-smi ran in a 12-CPU job."""
    topo = load_recorded("05")
    assert topo.gpus[2].cpu_affinity == (1, 3, 5, 7, 9, 11)
    assert topo.numa_nodes[1] == tuple(range(1, 48, 2))
    assert topo.allowed_cpus == tuple(range(12))
    assert all(topo.core_of[c] == c for c in range(48))  # interleaved: no sibling guess


@pytest.mark.parametrize(
    ("name", "cpu", "core"),
    [("01", 176, 48), ("01", 48, 48), ("03", 112, 0), ("03", 223, 111), ("04", 56, 24), ("09", 36, 12)],
)
def test_hyperthread_siblings_inferred(name: str, cpu: int, core: int) -> None:
    assert load_recorded(name).core_of[cpu] == core


def test_infer_core_of_rules() -> None:
    assert infer_core_of([parse_cpulist("0-3,8-11")], None) == {0: 0, 1: 1, 2: 2, 3: 3, 8: 0, 9: 1, 10: 2, 11: 3}
    assert infer_core_of([parse_cpulist("0-3,8-11")], 1) == {c: c for c in (0, 1, 2, 3, 8, 9, 10, 11)}
    assert infer_core_of([parse_cpulist("0-3,8-10")], 2) == {c: c for c in (0, 1, 2, 3, 8, 9, 10)}
    assert infer_core_of([(0, 2, 4)], None) == {0: 0, 2: 2, 4: 4}


def test_topology_without_listing_has_no_uuids() -> None:
    topo = topology_from_smi(recorded_texts("07")[0])
    assert [g.uuid for g in topo.gpus] == [None] * 4
    assert topo.numa_nodes == {0: tuple(range(24)), 1: tuple(range(24, 48))}


def test_listing_must_match_the_matrix() -> None:
    topo_text, listing, _, _ = recorded_texts("07")
    with pytest.raises(TopologyError, match="same machine"):
        topology_from_smi(topo_text, "\n".join(listing.splitlines()[:3]))


def test_parse_smi_list_with_mig() -> None:
    text = (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5fa2d0d8-0d0a-4a6a-8a7d-1c2b3d4e5f60)\n"
        "  MIG 3g.40gb     Device  0: (UUID: MIG-0a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d)\n"
        "  MIG 3g.40gb     Device  1: (UUID: MIG-1a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d)\n"
        "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-6fa2d0d8-0d0a-4a6a-8a7d-1c2b3d4e5f60)\n"
    )
    gpus = parse_smi_list(text)
    assert [(g.index, g.name) for g in gpus] == [(0, "NVIDIA A100-SXM4-80GB"), (1, "NVIDIA A100-SXM4-80GB")]
    assert [len(g.mig_uuids) for g in gpus] == [2, 0]
    assert gpus[0].mig_uuids[1].startswith("MIG-1a1b")


@pytest.mark.parametrize(
    ("parser", "text", "match"),
    [
        (parse_smi_list, "No devices were found\n", "UUID"),
        (parse_numactl_hardware, "No NUMA available on this system\n", "node 0 cpus"),
        (parse_topo_matrix, "", "GPU0"),
        (parse_topo_matrix, "nvidia-smi: command not found\n", "GPU0"),
        (parse_topo_matrix, "\tGPU0\tGPU1\tCPU Affinity\n", "no GPU rows"),
        (parse_topo_matrix, "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV99x\t0-3\n", "unknown link"),
        (parse_topo_matrix, "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n", "cells"),
        (parse_topo_matrix, "\tGPU0\tCPU Affinity\nGPU0\t X \t0-3;5\n", "CPU Affinity"),
    ],
)
def test_garbage_is_a_clear_error(parser: Callable[[str], object], text: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        parser(text)


def test_parse_numactl_and_lscpu() -> None:
    _, _, numactl, lscpu = recorded_texts("h200x2")
    assert numactl is not None and lscpu is not None
    assert parse_numactl_hardware(numactl) == {0: tuple(range(32))}
    facts = parse_lscpu(lscpu)
    assert (dict(facts.numa_nodes), facts.threads_per_core, facts.sockets) == ({0: tuple(range(32))}, 1, 1)
    dgx = parse_lscpu(recorded_texts("01")[3] or "")
    assert len(dgx.numa_nodes) == 8 and dgx.threads_per_core == 2 and dgx.sockets == 2
    assert dgx.numa_nodes[7] == parse_cpulist("112-127,240-255")


def test_memory_only_numa_node_left_out() -> None:
    text = "available: 2 nodes (0-1)\nnode 0 cpus: 0 1\nnode 0 size: 1 MB\nnode 1 cpus:\nnode 1 size: 9 MB\n"
    assert parse_numactl_hardware(text) == {0: (0, 1)}


def test_cpu_affinity_na_and_soc() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSOC\tN/A\tN/A\nGPU1\tSOC\t X \tN/A\tN/A\n"
    topo = topology_from_smi(text)
    assert topo.links[(0, 1)] == "SYS"
    assert [g.cpu_affinity for g in topo.gpus] == [None, None]
    assert topo.allowed_cpus == () and topo.numa_nodes == {}


def test_from_files(tmp_path: Path) -> None:
    topo_text, listing, _, _ = recorded_texts("07")
    (tmp_path / "topo.txt").write_text(topo_text)
    (tmp_path / "list.txt").write_text(listing)
    topo = topology_from_smi_files(tmp_path / "topo.txt", tmp_path / "list.txt")
    assert topo.source == f"smi:{tmp_path / 'topo.txt'}" and all(g.uuid for g in topo.gpus)
    with pytest.raises(TopologyError, match="cannot read the saved nvidia-smi -L"):
        topology_from_smi_files(tmp_path / "topo.txt", tmp_path / "missing.txt")


def test_lscpu_without_any_fact_is_an_error() -> None:
    with pytest.raises(TopologyError, match="lscpu: no 'Socket"):
        parse_lscpu("hello: world\nnot lscpu at all\n")


@pytest.mark.parametrize("which", ["topo", "list", "numactl", "lscpu"])
def test_file_that_does_not_parse_is_named(tmp_path: Path, which: str) -> None:
    topo_text, listing, numactl, lscpu = recorded_texts("h200x2")
    texts = {"topo": topo_text, "list": listing, "numactl": numactl or "", "lscpu": lscpu or ""}
    texts[which] = "nvidia-smi: command not found\n"
    paths = {name: tmp_path / f"{name}.txt" for name in texts}
    for name, path in paths.items():
        path.write_text(texts[name])
    with pytest.raises(TopologyError) as e:
        topology_from_smi_files(paths["topo"], paths["list"], paths["numactl"], paths["lscpu"])
    assert str(e.value).startswith(f"{paths[which]}: ")
