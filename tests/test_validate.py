"""The validator over constructed configs and topologies: every check, each status."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from openclaw_launch.codec import ReportShapeError, from_json, to_json
from openclaw_launch.config.model import Config, GpuSpec, NodeSpec, Runtime
from openclaw_launch.config.reader import load_config
from openclaw_launch.errors import PlanError, TopologyError
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, PlanOptions
from openclaw_launch.topology.model import GpuInfo, IbPort, NvLink, PcieLink, Topology
from openclaw_launch.validate.host import run_checks
from openclaw_launch.validate.results import (
    CheckResult,
    Thresholds,
    ValidateReport,
    exit_code,
    format_results,
    summarize,
    validate_report,
)

CONTEXT = run_context("r", "/tmp", None)  # a plan that is not run: no pid in its run directory

UUID0 = "GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee"
UUID1 = "GPU-593502f1-407a-3b77-45a0-032830195d52"
UUID2 = "GPU-11111111-2222-3333-4444-555555555555"
BUS0, BUS1, BUS2 = "0000:00:06.0", "0000:00:07.0", "0000:00:08.0"
NUMACTL = "/usr/bin/numactl"
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class FakeMps:
    answering: bool
    client_count: int = 0
    error: str | None = None
    clients_per_gpu: Mapping[str, int] = field(default_factory=dict)


def h200_gpu(index: int, uuid: str, bus: str, **kw: object) -> GpuInfo:
    """An H200 as recorded on the 2x H200 host: sysfs numa_node -1 (None), 18 NVLinks, gen5 x16."""
    base = GpuInfo(
        index=index,
        uuid=uuid,
        pci_bus_id=bus,
        name="NVIDIA H200",
        numa_node=None,
        cpu_affinity=tuple(range(32)),
        nvlinks=tuple(NvLink(link=i, active=True) for i in range(18)),
        pcie=PcieLink(gen=5, max_gen=5, width=16, max_width=16),
        aer={"correctable": 0, "nonfatal": 0, "fatal": 0},
        retired_pages=0,
        ecc_uncorrected=0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def h200_topology(*gpus: GpuInfo, **kw: object) -> Topology:
    gpus = gpus or (h200_gpu(0, UUID0, BUS0), h200_gpu(1, UUID1, BUS1))
    base = Topology(
        gpus=gpus,
        numa_nodes={0: tuple(range(32))},
        allowed_cpus=tuple(range(32)),
        links={(0, 1): "NV18", (1, 0): "NV18"},
        hostname="h200",
        source="test",
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def h200_config(*gpus: GpuSpec, **runtime: object) -> Config:
    gpus = gpus or (
        GpuSpec(uuid=UUID0, numa_node=0, pci_bus_id=BUS0, nvlink_peers=(UUID1,)),
        GpuSpec(uuid=UUID1, numa_node=0, pci_bus_id=BUS1, nvlink_peers=(UUID0,)),
    )
    return Config(nodes=(NodeSpec(name="node0", ip="10.0.0.1", gpus=gpus),), runtime=Runtime(**runtime))  # type: ignore[arg-type]


def one_gpu_config(uuid: str = UUID0, **spec: object) -> Config:
    return h200_config(GpuSpec(uuid=uuid, **spec))  # type: ignore[arg-type]


def check(results: list[CheckResult], name: str, subject_part: str = "") -> CheckResult:
    found = [r for r in results if r.name == name and subject_part in r.subject]
    assert len(found) == 1, f"expected one {name!r} for {subject_part!r}, got {found}\n{format_results(results)}"
    return found[0]


def names(results: list[CheckResult]) -> set[str]:
    return {r.name for r in results}


def run(config: Config | None = None, topology: Topology | None = None, **kw: object) -> list[CheckResult]:
    kw.setdefault("numactl_path", NUMACTL)
    return run_checks(config or h200_config(), topology or h200_topology(), "node0", **kw)  # type: ignore[arg-type]


# --- the recorded host --------------------------------------------------------


def test_h200_host_passes_except_missing_numa_information() -> None:
    results = run()
    not_passed = [r for r in results if r.status != "pass"]
    assert [(r.name, r.status) for r in not_passed] == [("numa_node", "warn"), ("numa_node", "warn")]
    assert all("host reports no NUMA information" in r.message for r in not_passed)
    assert exit_code(results) == 0
    assert names(results) == {
        "numactl",
        "uuid_present",
        "bus_id",
        "numa_node",
        "nvlink_peer",
        "nvlink_active",
        "pcie_link",
        "pcie_aer",
        "retired_pages",
        "ecc_uncorrected",
        "unconfigured_gpus",
    }
    assert check(results, "uuid_present", UUID0).subject == f"GPU 0 {UUID0}"


def test_unknown_node_is_a_plan_error_listing_nodes() -> None:
    with pytest.raises(PlanError, match="node0"):
        run_checks(h200_config(), h200_topology(), "nodeX", numactl_path=NUMACTL)


# --- identity: uuid, bus id, NUMA ------------------------------------------------


def test_absent_uuid_fails_and_lists_gpus_found() -> None:
    results = run(one_gpu_config(uuid=UUID2))
    r = check(results, "uuid_present", UUID2)
    assert r.status == "fail"
    assert r.found == "absent"
    assert UUID0 in r.message and UUID1 in r.message and BUS0 in r.message
    # nothing else is checked for a GPU that is not there
    assert [x.name for x in results if UUID2 in x.subject] == ["uuid_present"]
    assert exit_code(results) == 1


def test_absent_uuid_on_host_without_gpus() -> None:
    r = check(run(topology=h200_topology(gpus=())), "uuid_present", UUID0)
    assert r.status == "fail" and "none" in r.message


def test_uuid_matched_case_insensitively() -> None:
    assert check(run(one_gpu_config(uuid=UUID0.upper())), "uuid_present").status == "pass"


@pytest.mark.parametrize("strictness", ["fail", "warn"])
def test_bus_id_mismatch_follows_strictness(strictness: str) -> None:
    results = run(h200_config(GpuSpec(uuid=UUID0, pci_bus_id=BUS2), strictness=strictness))
    r = check(results, "bus_id")
    assert (r.status, r.found, r.expected) == (strictness, BUS0, BUS2)


def test_bus_id_mismatch_fails_by_default_and_cli_override_wins() -> None:
    cfg = one_gpu_config(uuid=UUID0, pci_bus_id=BUS2)
    assert check(run(cfg), "bus_id").status == "fail"
    assert check(run(cfg, strictness="warn"), "bus_id").status == "warn"


def test_bus_id_pass_unconfigured_and_unknown() -> None:
    assert check(run(one_gpu_config(uuid=UUID0, pci_bus_id=BUS0)), "bus_id").status == "pass"
    assert "bus_id" not in names(run(one_gpu_config(uuid=UUID0)))
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, pci_bus_id=None))
    r = check(run(one_gpu_config(uuid=UUID0, pci_bus_id=BUS0), topo), "bus_id")
    assert (r.status, r.found) == ("warn", "not available")


def test_numa_node_pass_mismatch_and_unconfigured() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, numa_node=1))
    assert check(run(one_gpu_config(uuid=UUID0, numa_node=1), topo), "numa_node").status == "pass"
    r = check(run(one_gpu_config(uuid=UUID0, numa_node=0), topo), "numa_node")
    assert (r.status, r.found, r.expected) == ("fail", "1", "0")
    cfg = h200_config(GpuSpec(uuid=UUID0, numa_node=0), strictness="warn")
    assert check(run(cfg, topo), "numa_node").status == "warn"
    assert "numa_node" not in names(run(one_gpu_config(uuid=UUID0), topo))


# --- NVLink ----------------------------------------------------------------------


def test_nvlink_peer_from_link_matrix() -> None:
    r = check(run(), "nvlink_peer", UUID0)
    assert (r.status, r.found) == ("pass", "NV18 to GPU 1")


def test_inactive_nvlink_to_the_peer_fails_validate_as_it_fails_plan() -> None:
    """NVML sees GPU 0's links to GPU 1's bus, all down; the link matrix of an older reading says NV18.
    validate and plan judge it with the one rule (Topology.link_between)."""
    down = tuple(NvLink(link=i, active=False, remote_bus_id=BUS1, remote_type="gpu") for i in range(18))
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, nvlinks=down), h200_gpu(1, UUID1, BUS1))
    r = check(run(topology=topo), "nvlink_peer", UUID0)
    assert (r.status, r.found) == ("fail", "inactive NVLink to GPU 1") and "down" in r.message
    with pytest.raises(TopologyError, match="not NVLinked to its configured peer .*inactive NVLink"):
        build_plan(h200_config(), topo, CONTEXT, PlanOptions(entry=Entry("script", "t.py"), numactl=NUMACTL))
    up = tuple(NvLink(link=i, active=i > 0, remote_bus_id=BUS1, remote_type="gpu") for i in range(18))
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, nvlinks=up), h200_gpu(1, UUID1, BUS1), links={})
    assert check(run(topology=topo), "nvlink_peer", UUID0).status == "pass"
    build_plan(h200_config(), topo, CONTEXT, PlanOptions(entry=Entry("script", "t.py"), numactl=NUMACTL))


def test_nvlink_peer_over_pcie_follows_strictness() -> None:
    topo = h200_topology(links={(0, 1): "PHB", (1, 0): "PHB"})
    r = check(run(topology=topo), "nvlink_peer", UUID0)
    assert (r.status, r.found) == ("fail", "PHB to GPU 1")
    cfg = h200_config(GpuSpec(uuid=UUID0, nvlink_peers=(UUID1,)), GpuSpec(uuid=UUID1), strictness="warn")
    assert check(run(cfg, topo), "nvlink_peer").status == "warn"


def test_nvlink_peer_from_nvml_remote_bus_ids() -> None:
    links = tuple(NvLink(link=i, active=True, remote_bus_id=BUS1) for i in range(4))
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, nvlinks=links), h200_gpu(1, UUID1, BUS1), links={})
    r = check(run(topology=topo), "nvlink_peer", UUID0)
    assert (r.status, r.found) == ("pass", "NV to GPU 1")


def test_nvlink_peer_unknown_or_absent() -> None:
    r = check(run(topology=h200_topology(links={})), "nvlink_peer", UUID0)
    assert (r.status, r.found) == ("warn", "unknown to GPU 1")
    cfg = h200_config(GpuSpec(uuid=UUID0, nvlink_peers=(UUID2,)))
    r = check(run(cfg), "nvlink_peer", UUID0)
    assert (r.status, r.found) == ("fail", "peer not on this host")


def test_down_nvlink_fails() -> None:
    links = tuple(NvLink(link=i, active=i not in (3, 7)) for i in range(18))
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, nvlinks=links), h200_gpu(1, UUID1, BUS1))
    r = check(run(topology=topo), "nvlink_active", UUID0)
    assert r.status == "fail"
    assert r.found == "16/18 active (down: 3, 7)"
    assert "a down NVLink makes this GPU a straggler" in r.message
    assert check(run(topology=topo), "nvlink_active", UUID1).status == "pass"


def test_gpu_without_nvlinks_skips_active_check() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, nvlinks=()))
    assert "nvlink_active" not in names(run(one_gpu_config(uuid=UUID0), topo))


# --- numactl -----------------------------------------------------------------------


def test_numactl_present_passes() -> None:
    r = check(run(), "numactl")
    assert (r.status, r.found, r.subject) == ("pass", NUMACTL, "node0")


def test_numactl_missing_warns_as_the_plan_does_when_binding_needs_it() -> None:
    """run starts the workers unbound (the plan warns); validate says the same, it does not fail."""
    r = check(run(numactl_path=None), "numactl")
    assert r.status == "warn" and "install numactl" in r.message
    plan = build_plan(h200_config(), h200_topology(), CONTEXT, PlanOptions(entry=Entry("script", "t.py"), numactl=None))
    assert r.message in plan.warnings


def test_numactl_missing_passes_with_binding_none_whatever_the_mem_policy() -> None:
    """configs/cpu-only.yaml (binding none, mem_policy bind by default): run never uses numactl."""
    for mem_policy in ("bind", "preferred", "local"):
        results = run(h200_config(binding="none", mem_policy=mem_policy), numactl_path=None)
        assert check(results, "numactl").status == "pass"
        assert exit_code(results) == 0


def test_validate_of_the_shipped_cpu_only_config_without_numactl() -> None:
    cfg = load_config(REPO / "configs" / "cpu-only.yaml")
    r = check(run_checks(cfg, h200_topology(), "localhost", numactl_path=None), "numactl")
    assert (r.status, r.found) == ("pass", "not found")


# --- PCIe, AER, memory ----------------------------------------------------------------


def test_pcie_trained_below_max_warns() -> None:
    slow = PcieLink(gen=4, max_gen=5, width=8, max_width=16)
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, pcie=slow))
    r = check(run(one_gpu_config(uuid=UUID0), topo), "pcie_link")
    assert (r.status, r.found, r.expected) == ("warn", "gen4 x8", "gen5 x16")


def test_pcie_gen_only_below_max_mentions_idle_downshift() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, pcie=PcieLink(gen=1, max_gen=5, width=16, max_width=16)))
    r = check(run(one_gpu_config(uuid=UUID0), topo), "pcie_link")
    assert r.status == "warn" and "under load" in r.message


def test_pcie_unknown_is_skipped_and_partial_knowledge_passes() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, pcie=None))
    assert "pcie_link" not in names(run(one_gpu_config(uuid=UUID0), topo))
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, pcie=PcieLink(gen=5, max_gen=None, width=None, max_width=16)))
    r = check(run(one_gpu_config(uuid=UUID0), topo), "pcie_link")
    assert (r.status, r.found, r.expected) == ("pass", "gen5 x?", "gen? x16")


@pytest.mark.parametrize(
    ("aer", "status"),
    [
        ({"correctable": 100, "nonfatal": 0, "fatal": 0}, "pass"),
        ({"correctable": 101, "nonfatal": 0, "fatal": 0}, "warn"),
        ({"correctable": 0, "nonfatal": 1, "fatal": 0}, "fail"),
        ({"correctable": 0, "nonfatal": 0, "fatal": 2}, "fail"),
        ({"correctable": 5}, "pass"),
    ],
)
def test_aer_counters(aer: dict[str, int], status: str) -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, aer=aer))
    r = check(run(one_gpu_config(uuid=UUID0), topo), "pcie_aer")
    assert r.status == status
    assert r.expected == "correctable <= 100, nonfatal 0, fatal 0"


def test_aer_threshold_is_configurable_and_unknown_skipped() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, aer={"correctable": 3, "nonfatal": 0, "fatal": 0}))
    r = check(run(one_gpu_config(uuid=UUID0), topo, thresholds=Thresholds(aer_correctable=2)), "pcie_aer")
    assert (r.status, r.found) == ("warn", "correctable 3, nonfatal 0, fatal 0")
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, aer=None))
    assert "pcie_aer" not in names(run(one_gpu_config(uuid=UUID0), topo))


def test_retired_pages_and_ecc() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, retired_pages=4, ecc_uncorrected=1))
    results = run(one_gpu_config(uuid=UUID0), topo)
    assert check(results, "retired_pages").status == "warn"
    assert (check(results, "ecc_uncorrected").status, check(results, "ecc_uncorrected").found) == ("fail", "1")
    relaxed = run(one_gpu_config(uuid=UUID0), topo, thresholds=Thresholds(retired_pages=4))
    assert check(relaxed, "retired_pages").status == "pass"
    unknown = h200_topology(h200_gpu(0, UUID0, BUS0, retired_pages=None, ecc_uncorrected=None))
    assert not {"retired_pages", "ecc_uncorrected"} & names(run(one_gpu_config(uuid=UUID0), unknown))


# --- InfiniBand ----------------------------------------------------------------------


def test_infiniband_ports() -> None:
    ports = (
        IbPort("mlx5_0", 1, "4: ACTIVE", {"symbol_error": 0, "link_downed": 0, "port_xmit_data": 10**12}),
        IbPort("mlx5_1", 1, "1: DOWN", {}),
        IbPort("mlx5_2", 1, "4: ACTIVE", {"symbol_error": 11, "link_downed": 1, "port_rcv_errors": 10}),
        IbPort("mlx5_3", 1, None, {"port_xmit_data": 5}),
    )
    results = run(topology=h200_topology(infiniband=ports))
    assert check(results, "ib_port_state", "mlx5_0 port 1").status == "pass"
    assert check(results, "ib_port_errors", "mlx5_0").status == "pass"
    down = check(results, "ib_port_state", "mlx5_1")
    assert (down.status, down.found) == ("warn", "1: DOWN")
    bad = check(results, "ib_port_errors", "mlx5_2")
    assert bad.status == "warn"
    assert bad.found == "link_downed 1, symbol_error 11"  # port_rcv_errors 10 is within its limit
    assert bad.expected == "link_downed <= 0, symbol_error <= 10"
    # unknown state and traffic-only counters: nothing to report
    assert not [r for r in results if "mlx5_3" in r.subject]
    assert not [r for r in results if "mlx5_1" in r.subject and r.name == "ib_port_errors"]
    assert exit_code(results) == 0


def test_infiniband_thresholds_configurable() -> None:
    ports = (IbPort("mlx5_0", 1, "4: ACTIVE", {"symbol_error": 11}),)
    th = Thresholds(ib_counters={"symbol_error": 100})
    assert check(run(topology=h200_topology(infiniband=ports), thresholds=th), "ib_port_errors").status == "pass"


# --- unconfigured GPUs -------------------------------------------------------------------


def test_gpu_present_but_not_configured_warns() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0), h200_gpu(1, UUID1, BUS1), h200_gpu(3, UUID2, BUS2))
    results = run(topology=topo)
    r = check(results, "unconfigured_gpus", UUID2)
    assert r.status == "warn" and "GPU 3 present but not configured" in r.message
    assert r.subject == f"GPU 3 {UUID2}"
    assert exit_code(results) == 0


def test_all_gpus_configured_passes() -> None:
    r = check(run(), "unconfigured_gpus")
    assert (r.status, r.subject) == ("pass", "node0")


# --- MPS --------------------------------------------------------------------------------


def test_mps_checks_only_when_enabled() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, mps_clients=9), h200_gpu(1, UUID1, BUS1))
    results = run(topology=topo, mps=FakeMps(answering=True, client_count=9))
    assert not {"mps_daemon", "mps_clients", "mps_clients_total"} & names(results)


def test_mps_daemon_states() -> None:
    cfg = h200_config(enable_mps=True, mps_max_clients_per_gpu=2)
    assert check(run(cfg, mps=FakeMps(answering=True)), "mps_daemon").status == "pass"
    r = check(run(cfg, mps=FakeMps(answering=False, error="no daemon on /tmp/nvidia-mps")), "mps_daemon")
    assert r.status == "warn" and "no daemon on /tmp/nvidia-mps" in r.message
    r = check(run(cfg, mps=None), "mps_daemon")
    assert (r.status, r.found) == ("warn", "not available")


def test_mps_check_says_it_checked_the_system_daemon_not_the_private_one() -> None:
    cfg = h200_config(enable_mps=True, mps_max_clients_per_gpu=2)
    for answering in (True, False):
        r = check(run(cfg, mps=FakeMps(answering=answering), mps_pipe_dir="/tmp/nvidia-mps"), "mps_daemon")
        assert r.found.startswith("system daemon (/tmp/nvidia-mps)")
        assert "not the private one `run` starts for this job" in r.message


def test_real_mps_status_fits_the_protocol() -> None:
    from openclaw_launch.run.mps.status import MpsServer, MpsStatus

    status = MpsStatus(answering=True, daemon_pid=10, servers=(MpsServer(11, (12, 13, 14, 15, 16)),))
    results = run(h200_config(enable_mps=True, mps_max_clients_per_gpu=2), mps=status)
    assert check(results, "mps_daemon").status == "pass"
    total = check(results, "mps_clients_total")
    assert (total.status, total.found, total.expected) == ("fail", "5 clients", "<= 4")


def test_mps_total_clients_against_limit_times_gpus() -> None:
    cfg = h200_config(enable_mps=True, mps_max_clients_per_gpu=2)
    assert check(run(cfg, mps=FakeMps(answering=True, client_count=4)), "mps_clients_total").status == "pass"
    assert "mps_clients_total" not in names(run(h200_config(enable_mps=True), mps=FakeMps(answering=True)))


def test_mps_clients_per_gpu_from_topology() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, mps_clients=3), h200_gpu(1, UUID1, BUS1, mps_clients=2))
    cfg = h200_config(enable_mps=True, mps_max_clients_per_gpu=2)
    results = run(cfg, topo, mps=FakeMps(answering=True))
    over = check(results, "mps_clients", UUID0)
    assert (over.status, over.found, over.expected) == ("fail", "3", "<= 2")
    assert check(results, "mps_clients", UUID1).status == "pass"
    assert exit_code(results) == 1
    unknown = run(cfg, mps=FakeMps(answering=True))  # per-GPU counts not known: no per-GPU line
    assert "mps_clients" not in names(unknown)
    unlimited = run(h200_config(enable_mps=True), topo, mps=FakeMps(answering=True))
    assert check(unlimited, "mps_clients", UUID0).expected == "no limit configured"


# --- CPU nodes ----------------------------------------------------------------------------


def cpu_config(workers: int) -> Config:
    return Config(nodes=(NodeSpec(name="cpu0", cpu_workers=workers),))


def cpu_topology(ncpus: int) -> Topology:
    return Topology(numa_nodes={0: tuple(range(ncpus))}, allowed_cpus=tuple(range(ncpus)))


@pytest.mark.parametrize(("workers", "ncpus", "status"), [(2, 2, "pass"), (4, 2, "warn")])
def test_cpu_workers_against_allowed_cpus(workers: int, ncpus: int, status: str) -> None:
    results = run_checks(cpu_config(workers), cpu_topology(ncpus), "cpu0", numactl_path=NUMACTL)
    r = check(results, "cpu_workers")
    assert (r.status, r.found, r.expected) == (status, f"{ncpus} allowed CPUs", f">= {workers} CPUs")
    assert names(results) == {"numactl", "cpu_workers"}


def test_cpu_workers_allowed_cpus_unknown() -> None:
    results = run_checks(cpu_config(2), Topology(), "cpu0", numactl_path=NUMACTL)
    assert check(results, "cpu_workers").found == "not available"


# --- output formats and exit code -------------------------------------------------------------


def mixed_results() -> list[CheckResult]:
    links = tuple(NvLink(link=i, active=i != 0) for i in range(18))
    topo = h200_topology(
        h200_gpu(0, UUID0, BUS0, nvlinks=links, pcie=PcieLink(4, 5, 8, 16)),
        h200_gpu(1, UUID1, BUS1),
    )
    return run(topology=topo)


def test_format_one_line_per_check_and_summary() -> None:
    results = mixed_results()
    text = format_results(results)
    lines = text.splitlines()
    assert len(lines) == len(results) + 1
    for line, r in zip(lines[:-1], results, strict=True):
        assert line.startswith(r.status.upper() + "  ")
        assert f"{r.name}: {r.found}" in line
        assert r.subject in line
    pcie = next(line for line in lines if "pcie_link" in line)
    assert "pcie_link: gen4 x8 (expected gen5 x16)" in pcie
    n_pass, n_warn, n_fail = summarize(results)
    assert (n_warn, n_fail) == (3, 1)  # 2x NUMA info, PCIe; the down NVLink
    assert n_pass + n_warn + n_fail == len(results)
    assert lines[-1] == f"{n_pass} passed, {n_warn} warnings, {n_fail} failed"


def test_format_empty() -> None:
    assert format_results([]) == "0 passed, 0 warnings, 0 failed"


def test_json_shape() -> None:
    results = mixed_results()
    doc = json.loads(json.dumps(to_json(validate_report(results))))
    assert doc["schema"] == 1
    assert set(doc) == {"schema", "checks", "summary"}
    assert len(doc["checks"]) == len(results)
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "subject", "found", "expected", "message"}
        assert c["status"] in ("pass", "warn", "fail")
    n_pass, n_warn, n_fail = summarize(results)
    assert doc["summary"] == {"passed": n_pass, "warnings": n_warn, "failed": n_fail}
    assert from_json(ValidateReport, doc) == validate_report(results)  # typed both ways, one codec
    doc["checks"][0]["status"] = "ok"
    with pytest.raises(
        ReportShapeError, match=r"checks\[0\]\.status: expected one of 'pass', 'warn', 'fail', found 'ok'"
    ):
        from_json(ValidateReport, doc)


def test_exit_code_policy() -> None:
    ok = CheckResult("a", "pass", "node0", "x", "x")
    warn = CheckResult("b", "warn", "node0", "x", "y")
    fail = CheckResult("c", "fail", "node0", "x", "y")
    assert exit_code([]) == 0
    assert exit_code([ok, warn]) == 0
    assert exit_code([ok, warn, fail]) == 1


def test_mps_clients_per_gpu_from_the_daemon_win_over_the_topology() -> None:
    topo = h200_topology(h200_gpu(0, UUID0, BUS0, mps_clients=0), h200_gpu(1, UUID1, BUS1))
    cfg = h200_config(enable_mps=True, mps_max_clients_per_gpu=2)
    daemon = FakeMps(answering=True, client_count=3, clients_per_gpu={UUID0.upper(): 3})
    results = run(cfg, topo, mps=daemon)
    assert (check(results, "mps_clients", UUID0).status, check(results, "mps_clients", UUID0).found) == ("fail", "3")
    assert "mps_clients" not in names([r for r in results if UUID1 in r.subject])  # neither source knows
    silent = FakeMps(answering=False, clients_per_gpu={UUID0: 3})  # a daemon that does not answer says nothing
    assert check(run(cfg, topo, mps=silent), "mps_clients", UUID0).found == "0"
