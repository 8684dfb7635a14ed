"""Which config node a launcher is: resolve_node over injected facts (no host, no Slurm needed)."""

from __future__ import annotations

import pytest

from openclaw_launch.agents.identity import local_identity, resolve_node
from openclaw_launch.config.model import Config, NodeSpec
from openclaw_launch.errors import PlanError


def cluster(*nodes: tuple[str, str | None]) -> Config:
    return Config(nodes=tuple(NodeSpec(name=n, ip=ip, cpu_workers=1) for n, ip in nodes), source="c.yaml")


THREE = cluster(("gpu1", "10.0.0.1"), ("gpu2.example.org", "10.0.0.2"), ("gpu3", "fd00::3"))


def test_cli_node_wins_over_slurm_and_host() -> None:
    env = {"SLURMD_NODENAME": "gpu1", "SLURM_NODEID": "0"}
    assert resolve_node(THREE, "gpu3", env, ["gpu1"], ["10.0.0.1"]) == "gpu3"


def test_unknown_cli_node_lists_the_valid_names() -> None:
    with pytest.raises(PlanError, match=r"'nope' is not in c.yaml; the config has: gpu1, gpu2.example.org, gpu3"):
        resolve_node(THREE, "nope", {})


def test_slurmd_nodename_naming_a_node_wins_over_slurm_nodeid() -> None:
    assert resolve_node(THREE, None, {"SLURMD_NODENAME": "gpu3", "SLURM_NODEID": "0"}) == "gpu3"


def test_slurmd_nodename_not_in_the_config_falls_back_to_slurm_nodeid() -> None:
    assert resolve_node(THREE, None, {"SLURMD_NODENAME": "c042", "SLURM_NODEID": "1"}) == "gpu2.example.org"


@pytest.mark.parametrize(("nodeid", "name"), [("0", "gpu1"), ("1", "gpu2.example.org"), ("2", "gpu3")])
def test_slurm_nodeid_indexes_the_config_nodes(nodeid: str, name: str) -> None:
    assert resolve_node(THREE, None, {"SLURM_NODEID": nodeid}, ["gpu1"], ["10.0.0.1"]) == name


def test_slurm_nodeid_out_of_range_says_how_many_nodes_there_are() -> None:
    with pytest.raises(PlanError, match=r"SLURM_NODEID=3 but c.yaml has only 3 node\(s\) \(gpu1, gpu2.example.org"):
        resolve_node(THREE, None, {"SLURM_NODEID": "3"})
    single = cluster(("only", None))
    with pytest.raises(PlanError, match="SLURM_NODEID=1"):  # two Slurm nodes, one config node: not both "only"
        resolve_node(single, None, {"SLURM_NODEID": "1"})


@pytest.mark.parametrize("nodeid", ["-1", "x", ""])
def test_malformed_slurm_nodeid_is_an_error_not_ignored(nodeid: str) -> None:
    with pytest.raises(PlanError, match="is not a node index; pass --node with one of: gpu1, gpu2.example.org, gpu3"):
        resolve_node(THREE, None, {"SLURM_NODEID": nodeid})


def test_single_node_needs_no_matching() -> None:
    assert resolve_node(cluster(("only", "10.9.9.9")), None, {}, ["elsewhere"], ["192.168.1.1"]) == "only"


@pytest.mark.parametrize(
    ("names", "addrs", "expected"),
    [
        (["GPU1"], [], "gpu1"),  # case-insensitive
        (["gpu1.example.org"], [], "gpu1"),  # host qualified, config short
        (["gpu2"], [], "gpu2.example.org"),  # host short, config qualified
        (["login"], ["127.0.0.1", "10.0.0.2"], "gpu2.example.org"),  # by address
        (["login"], ["fd00:0:0::3%eth0"], "gpu3"),  # IPv6 in another spelling, with a scope
    ],
)
def test_host_name_or_address_picks_the_node(names: list[str], addrs: list[str], expected: str) -> None:
    assert resolve_node(THREE, None, {}, names, addrs) == expected


def test_other_domain_with_the_same_short_name_is_not_a_match() -> None:
    cfg = cluster(("gpu1.a.org", None), ("gpu2.a.org", None))
    with pytest.raises(PlanError, match="no node matches"):
        resolve_node(cfg, None, {}, ["gpu1.b.org"], [])


def test_no_match_lists_every_node() -> None:
    with pytest.raises(
        PlanError, match=r"no node matches .* c.yaml; pass --node with one of: gpu1, gpu2.example.org, gpu3"
    ):
        resolve_node(THREE, None, {}, ["login"], ["192.168.1.1", "not-an-address"])


def test_several_matches_list_the_matching_nodes() -> None:
    loopback = cluster(("a", "127.0.0.1"), ("b", "127.0.0.1"), ("c", "10.0.0.3"))
    with pytest.raises(PlanError, match=r"several nodes match this host in c.yaml; pass --node with one of: a, b$"):
        resolve_node(loopback, None, {}, ["here"], ["127.0.0.1"])


def test_local_identity_reports_this_hosts_name_and_loopback() -> None:
    names, addrs = local_identity()
    assert names and names[0]
    assert "127.0.0.1" in addrs or "::1" in addrs


def test_slurm_host_position_in_the_expanded_nodelist_picks_the_node() -> None:
    env = {"SLURMD_NODENAME": "c09", "SLURM_STEP_NODELIST": "c[08-09],d1", "SLURM_NODEID": "0"}
    assert resolve_node(THREE, None, env) == "gpu2.example.org"  # c09 is the step's second host
    assert resolve_node(THREE, None, {**env, "SLURMD_NODENAME": "gpu3"}) == "gpu3"  # a config name wins
