from __future__ import annotations

import json
from pathlib import Path

import pytest
from topo_helpers import DATA, h200_nvml, load_recorded, recorded_names, write_sysfs

from openclaw_launch.errors import TopologyError
from openclaw_launch.topology.live import discover_topology
from openclaw_launch.topology.model import Topology
from openclaw_launch.topology.snapshot import SCHEMA, dump_snapshot, load_snapshot, save_snapshot

REDO = "openclaw-launch discover --snapshot"


def rich_host(tmp_path: Path) -> Topology:
    """The recorded H200 host plus AER counters and an InfiniBand port."""
    root = write_sysfs(
        tmp_path / "sys",
        numa_nodes={0: range(4)},
        siblings=[(0, 2), (1, 3)],
        sockets={0: 0, 1: 0, 2: 0, 3: 0},
        pci={"0000:00:06.0": {"numa_node": "0", "aer_dev_correctable": "TOTAL_ERR_COR 4"}},
        infiniband={"mlx5_0": {1: {"state": "4: ACTIVE", "counters/symbol_error": "2"}}},
    )
    return discover_topology(root, h200_nvml(), allowed_cpus=[0, 1])


@pytest.mark.parametrize("name", recorded_names())
def test_round_trip_recorded(tmp_path: Path, name: str) -> None:
    topo = load_recorded(name)
    save_snapshot(topo, tmp_path / "t.json")
    assert load_snapshot(tmp_path / "t.json") == topo


def test_round_trip_live_fields(tmp_path: Path) -> None:
    topo = rich_host(tmp_path)
    assert topo.gpus[0].aer == {"correctable": 4} and topo.infiniband and topo.socket_of
    path = tmp_path / "t.json"
    save_snapshot(topo, path)
    assert load_snapshot(path) == topo
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA
    assert data["links"] == {"0,1": "NV18", "1,0": "NV18"}
    assert data["gpus"][0]["cpu_affinity"] == "0-31"


def test_save_is_atomic_and_overwrites(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("old")
    save_snapshot(load_recorded("h200x2"), path)
    save_snapshot(load_recorded("07"), path)
    assert len(load_snapshot(path).gpus) == 4
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temp file left behind


def test_dump_is_plain_json() -> None:
    text = json.dumps(dump_snapshot(discover_topology(DATA / "sysfs" / "h200x2", h200_nvml())))
    assert json.loads(text)["gpus"][1]["pci_bus_id"] == "0000:00:07.0"


def _broken(tmp_path: Path, edit: str) -> Path:
    data = dump_snapshot(load_recorded("h200x2"))
    if edit == "schema":
        data["schema"] = "openclaw-topology/99"
    elif edit == "no-schema":
        del data["schema"]
    elif edit == "missing":
        del data["gpus"][0]["uuid"]
    elif edit == "bad-cpus":
        data["allowed_cpus"] = "0-x"
    elif edit == "bad-link":
        data["links"] = {"0-1": "NV18"}
    path = tmp_path / f"{edit}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ("schema", "openclaw-topology/99"),
        ("no-schema", "schema"),
        ("missing", r"'gpus\[0\]\.uuid'"),
        ("bad-cpus", "allowed_cpus: expected a CPU list"),
        ("bad-link", "malformed"),
    ],
)
def test_bad_snapshot(tmp_path: Path, edit: str, match: str) -> None:
    path = _broken(tmp_path, edit)
    with pytest.raises(TopologyError, match=match) as e:
        load_snapshot(path)
    assert str(path) in str(e.value) and REDO in str(e.value)


@pytest.mark.parametrize(("text", "match"), [(None, "cannot read"), ("{", "not valid JSON"), ("[]", "JSON object")])
def test_unreadable_snapshot(tmp_path: Path, text: str | None, match: str) -> None:
    path = tmp_path / "snap.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(TopologyError, match=match) as e:
        load_snapshot(path)
    assert str(path) in str(e.value) and REDO in str(e.value)


def test_config_given_as_snapshot_says_so(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("# a config\ncluster:\n  nodes:\n    - name: a\n      cpu_workers: 1\n")
    with pytest.raises(TopologyError, match="node.yaml is a config, not a topology snapshot: give it with --config"):
        load_snapshot(path)
