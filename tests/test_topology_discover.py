from __future__ import annotations

import pytest
import yaml
from topo_helpers import DATA, h200_nvml, load_recorded, recorded_names, recorded_texts

from openclaw_launch.config.discover import config_yaml_from_topology, host_config
from openclaw_launch.config.reader import parse_config
from openclaw_launch.errors import PlanError, TopologyError
from openclaw_launch.topology.live import discover_topology
from openclaw_launch.topology.model import GpuInfo, Topology
from openclaw_launch.topology.smi import topology_from_smi

H200_YAML = """\
# Written by openclaw-launch discover from sysfs:{root}.
# Check it against the machine with: openclaw-launch validate --config THIS_FILE
cluster:
  nodes:
    - name: "h200"
      ip: "10.0.0.5"
      gpus:
        - uuid: "GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee"
          numa_node: 0
          pci_bus_id: "0000:00:06.0"
          nvlink_peers: ["GPU-593502f1-407a-3b77-45a0-032830195d52"]
        - uuid: "GPU-593502f1-407a-3b77-45a0-032830195d52"
          numa_node: 0
          pci_bus_id: "0000:00:07.0"
          nvlink_peers: ["GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee"]
"""


def test_h200_config_text() -> None:
    root = DATA / "sysfs" / "h200x2"
    text = config_yaml_from_topology(discover_topology(root, h200_nvml()), "h200", "10.0.0.5")
    assert text == H200_YAML.format(root=root)


@pytest.mark.parametrize("name", recorded_names())
def test_config_from_every_recorded_host(name: str) -> None:
    topo = load_recorded(name)
    text = config_yaml_from_topology(topo, "node0", None)
    node = yaml.safe_load(text)["cluster"]["nodes"][0]
    assert node["name"] == "node0" and "ip" not in node
    assert [g["uuid"] for g in node["gpus"]] == [g.uuid for g in topo.gpus]
    assert [g["numa_node"] for g in node["gpus"]] == [g.numa_node for g in topo.gpus]
    for spec, gpu in zip(node["gpus"], topo.gpus, strict=True):
        linked = {topo.gpus[j].uuid for (i, j), v in topo.links.items() if i == gpu.index and v.startswith("NV")}
        assert set(spec.get("nvlink_peers", [])) == linked
        assert "pci_bus_id" not in spec  # topo -m does not say


@pytest.mark.parametrize("name", recorded_names())
def test_config_loads(name: str) -> None:
    config = parse_config(config_yaml_from_topology(load_recorded(name), "node0", "10.0.0.1"))
    node = config.node("node0")
    topo = load_recorded(name)
    assert [g.uuid for g in node.gpus] == [g.uuid for g in topo.gpus]
    assert [g.numa_node for g in node.gpus] == [g.numa_node for g in topo.gpus]


def test_gpus_without_uuid_need_the_listing() -> None:
    topo = topology_from_smi(recorded_texts("07")[0], source="smi:topo.txt")
    with pytest.raises(TopologyError, match="--smi-list") as e:
        config_yaml_from_topology(topo, "node0", None)
    assert "smi:topo.txt" in str(e.value)


def test_cpu_only_host() -> None:
    text = config_yaml_from_topology(Topology(allowed_cpus=(0, 1, 2), source="live"), "laptop", None)
    assert yaml.safe_load(text)["cluster"]["nodes"] == [{"name": "laptop", "cpu_workers": 3}]
    assert parse_config(text).node("laptop").cpu_workers == 3


def test_awkward_names_stay_strings() -> None:
    text = config_yaml_from_topology(Topology(allowed_cpus=(0,)), 'no: "yes" #x', "10.0.0.1")
    assert yaml.safe_load(text)["cluster"]["nodes"][0]["name"] == 'no: "yes" #x'


def test_host_config_one_rank_per_gpu_or_cpu_workers() -> None:
    gpus = tuple(GpuInfo(i, f"GPU-{i}") for i in range(2)) + (GpuInfo(2, None),)  # no UUID: not usable
    (node,) = host_config(Topology(gpus=gpus), None).nodes
    assert (node.name, node.ip, [g.uuid for g in node.gpus]) == ("localhost", "127.0.0.1", ["GPU-0", "GPU-1"])
    assert [g.uuid for g in host_config(Topology(gpus=gpus), 1).nodes[0].gpus] == ["GPU-0"]
    with pytest.raises(PlanError, match="--nproc-per-node 3 but this host has 2 GPU"):
        host_config(Topology(gpus=gpus), 3)
    assert host_config(Topology(), None).nodes[0].cpu_workers == 1
    assert host_config(Topology(), 4).nodes[0].cpu_workers == 4
