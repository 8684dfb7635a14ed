"""Preflight: tiers and expectations on recorded hosts (pure), verdicts, and real CPU runs
through the launcher (gloo, small sizes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_runner import invoke
from guards import GUARD_S

from openclaw_launch.codec import to_json
from openclaw_launch.config.discover import host_config
from openclaw_launch.config.model import PreflightSettings
from openclaw_launch.plan.build import build_plan
from openclaw_launch.plan.context import run_context
from openclaw_launch.plan.model import Entry, LaunchPlan, PlanOptions
from openclaw_launch.preflight.record import record, recorded_floors, usable_floors
from openclaw_launch.preflight.tiers import (
    Expectation,
    Tier,
    expectations,
    judge,
    network_expectations,
    plan_tiers,
)
from openclaw_launch.preflight.worker import select_device
from openclaw_launch.report.preflight import NetworkExpectation
from openclaw_launch.topology.model import IbPort, Topology
from openclaw_launch.topology.smi import topology_from_smi
from openclaw_launch.topology.snapshot import load_snapshot
from tests.topo_helpers import fake_smi_list, load_recorded, recorded_names

CONTEXT = run_context("r", "/tmp", None)  # a plan that is not run: no pid in its run directory

ROOT = Path(__file__).resolve().parent.parent


def _plan(topo: Topology) -> LaunchPlan:
    cfg = host_config(topo, None)
    return build_plan(cfg, topo, CONTEXT, PlanOptions(entry=Entry("module", "w"), node=cfg.nodes[0].name, numactl=None))


def _expected(topo: Topology, settings: PreflightSettings | None = None) -> dict[str, Expectation]:
    plan = _plan(topo)
    return expectations(plan_tiers(plan, topo), plan, topo, settings or PreflightSettings())


# The tiers and their derived floors (GB/s) on every recorded host.
EXPECTED_TIERS: dict[str, dict[str, float | None]] = {
    "h200x2": {"nvlink:0,1": 270.0, "node": 270.0},  # 18 links x 25 x 0.6
    "01": {"nvlink:0,1,2,3,4,5,6,7": 180.0, "node": 180.0},  # NVSwitch: 12 links per GPU
    "02": {"nvlink:0,1,2,3,4,5,6,7": 180.0, "node": 180.0},
    "03": {"nvlink:0,1,2,3,4,5,6,7": 270.0, "node": 270.0},
    "04": {"nvlink:0,1,2,3": 180.0, "node": 180.0},  # 4 links to each of 3 peers
    "05": {"node": None},  # PCIe only, and saved smi text has no PCIe gen/width
    "06": {"nvlink:0,1": 45.0, "nvlink:2,3": 45.0, "node": None},
    "07": {"nvlink:0,1,2,3": 180.0, "node": 180.0},
    "08": {"node": None},
    "09": {"nvlink:0,1,2,3,4,5,6,7": 90.0, "node": 90.0},  # hybrid cube mesh: 6 links per V100
    "10": {"node": None},
    "11": {"node": None},
    "15": {"node": None},
}


@pytest.mark.parametrize("name", recorded_names())
def test_tiers_and_derived_expectations_on_every_recorded_host(name: str) -> None:
    key = name if name == "h200x2" else name.split("_")[0]
    got = {t: e.gbps for t, e in _expected(load_recorded(name)).items()}
    assert got == EXPECTED_TIERS[key]


def test_islands_of_non_neighbour_pairs_and_pcie_from_the_snapshot() -> None:
    matrix = (
        "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
        "GPU0\t X \tSYS\tNV4\tSYS\t0-3\nGPU1\tSYS\t X \tSYS\tNV4\t0-3\n"
        "GPU2\tNV4\tSYS\t X \tSYS\t0-3\nGPU3\tSYS\tNV4\tSYS\t X \t0-3\n"
    )
    topo = topology_from_smi(matrix, fake_smi_list(4, name="NVIDIA A100-SXM4-80GB", seed=7))
    plan = _plan(topo)
    tiers = plan_tiers(plan, topo)
    assert [(t.name, t.ranks) for t in tiers] == [
        ("nvlink:0,2", (0, 2)),
        ("nvlink:1,3", (1, 3)),
        ("node", (0, 1, 2, 3)),
    ]
    assert _expected(topo)["nvlink:0,2"] == Expectation(60.0, "NVLink3 x4 links x 25 GB/s x 0.6")
    # The recorded H200 snapshot has NVML's links (18 to hidden switches) and PCIe gen5 x16.
    snap = load_snapshot(ROOT / "configs" / "h200x2.snapshot.json")
    exp = _expected(snap, PreflightSettings(expect_busbw_gbps={"node": 99.0}))
    assert exp["nvlink:0,1"].gbps == 270.0
    assert exp["node"] == Expectation(99.0, "config preflight.expect_busbw_gbps.node")


def test_verdicts_pass_warn_fail_wrong_sums_and_missing_ranks() -> None:
    tier = Tier("nvlink:0,1", "nvlink", (0, 1))
    exp = Expectation(100.0, "test")
    size = 10**9  # 2 ranks: busbw = size / seconds

    def run(seconds: float, correct: bool = True) -> Any:
        per_rank = {r: {"tiers": {tier.name: {"seconds": seconds * (1 + r) / 2, "correct": correct}}} for r in (0, 1)}
        return judge(tier, per_rank, exp, size, 20)

    assert (run(0.005).status, run(0.005).busbw_gbps) == ("pass", 200.0)  # the slowest rank's time counts
    assert run(0.0125).status == "warn"
    assert run(0.03).status == "fail" and "33 %" in run(0.03).message
    assert run(0.005, correct=False).status == "fail"
    missing = judge(tier, {0: {"tiers": {}}}, exp, size, 20)
    assert missing.status == "fail" and "rank(s) 0, 1" in missing.message
    assert (
        judge(tier, {0: {"tiers": {tier.name: {"seconds": 1, "correct": True}}}, 1: {}}, exp, size, 1).busbw_gbps
        is None
    )
    info = judge(
        tier,
        {r: {"tiers": {tier.name: {"seconds": 1.0, "correct": True}}} for r in (0, 1)},
        Expectation(None, "cpu"),
        size,
        1,
    )
    assert info.status == "info"


def test_record_round_trips_into_expectations() -> None:
    topo = load_recorded("h200x2")
    plan = _plan(topo)
    tiers = plan_tiers(plan, topo)
    per_rank = {r: {"tiers": {t.name: {"seconds": 0.004, "correct": True} for t in tiers}} for r in (0, 1)}
    results = [judge(t, per_rank, Expectation(None, ""), 2**30, 20) for t in tiers]
    saved = json.loads(json.dumps(to_json(record(results, plan, None))))
    assert list(saved) == ["format", "node", "tiers", "gemm", "pairs"]  # the documented order (docs/preflight.md)
    assert list(saved["tiers"]["node"]) == ["busbw_gbps", "size_bytes", "ranks", "gpus"]
    floors, warnings = usable_floors(recorded_floors(saved), "rec.json", tiers, plan, 2**30)
    assert floors == {"nvlink:0,1": 268.44, "node": 268.44} and warnings == []
    exp = expectations(tiers, plan, topo, PreflightSettings(), floors, "rec.json")
    assert exp["node"] == Expectation(214.75, "268.44 GB/s recorded in rec.json x 0.8")
    with pytest.raises(ValueError, match="not a preflight recording"):
        recorded_floors({"tiers": {}})


def test_network_expectation_from_the_ib_rate() -> None:
    ports = (IbPort("mlx5_0", 1, "4: ACTIVE", rate="400 Gb/sec (4X NDR)"), IbPort("mlx5_1", 1, "1: DOWN", rate="400"))
    assert network_expectations(Topology(infiniband=ports)) == [
        NetworkExpectation("mlx5_0/1", "400 Gb/sec (4X NDR)", 40.0, measured=False)
    ]


def test_gpu_ranks_select_their_planned_device() -> None:
    """The CUDA path of the worker, with a stand-in torch: the planned index, nccl."""
    calls: list[int] = []
    fake = SimpleNamespace(device=lambda kind, index=None: (kind, index), cuda=SimpleNamespace(set_device=calls.append))
    assert select_device("cuda", {"OPENCLAW_CUDA_DEVICE_INDEX": "3", "LOCAL_RANK": "1"}, fake) == (("cuda", 3), "nccl")
    assert select_device("cuda", {"LOCAL_RANK": "1"}, fake) == (("cuda", 0), "nccl")  # isolated: its only GPU
    assert calls == [3, 0]
    assert select_device("cpu", {}, fake) == (("cpu", None), "gloo")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openclaw_launch", *args], cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S
    )


def test_worker_times_sub_tiers_with_real_processes(tmp_path: Path) -> None:
    """The worker under `run`: 3 gloo ranks, two 2-rank tiers and the node, each with right sums, and
    the GEMM of the one rank the spec names."""
    spec = {
        "ranks": [0, 1, 2],
        "port": 0,
        "device": "cpu",
        "size_bytes": 4096,
        "iters": 2,
        "warmup": 1,
        "tiers": [{"name": "a", "ranks": [0, 2]}, {"name": "b", "ranks": [1, 2]}, {"name": "node", "ranks": [0, 1, 2]}],
        "node": "box",
        "node_rank": 0,
        "host": "box",
        "job": False,
        "gemm": {"n": 64, "reps": 2, "matmuls": 2, "ranks": {"0": {"gpu_index": None, "gpu_uuid": None}}},
    }
    from openclaw_launch.plan.context import free_port

    spec["port"] = free_port()
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = _cli(
        "--nproc-per-node",
        "3",
        "--telemetry",
        "off",
        "-m",
        "openclaw_launch.preflight.worker",
        str(tmp_path / "spec.json"),
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    docs = {r: json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(3)}
    assert sorted(docs[0]["tiers"]) == ["a", "node"] and sorted(docs[1]["tiers"]) == ["b", "node"]
    assert sorted(docs[2]["tiers"]) == ["a", "b", "node"]
    assert all(t["correct"] and t["seconds"] > 0 for d in docs.values() for t in d["tiers"].values())
    world = docs[1]["world"]  # every rank's results, gathered: rank 0 alone ran the GEMM
    assert [(e["rank"], e["gemm"] is not None) for e in world] == [(0, True), (1, False), (2, False)]
    assert world[0]["gemm"]["tflops"] > 0 and world[0]["gemm"]["dtype"] == "float32"


def test_preflight_cli_fails_below_expectation_then_records_and_expects(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "cluster:\n  nodes:\n    - {name: box, ip: 127.0.0.1, cpu_workers: 2}\n"
        "runtime: {binding: none, mem_policy: none}\n"
        "preflight:\n  expect_busbw_gbps: {node: 100000}\n  size_mib: 1\n  iters: 3\n"
    )
    report = tmp_path / "r.json"
    rec = tmp_path / "rec.json"
    slow = _cli("preflight", "--config", str(cfg), "--json", "--report", str(report), "--record", str(rec))
    assert slow.returncode == 1, slow.stderr
    doc = json.loads(slow.stdout)  # stdout is only the JSON: the workers' console went to stderr
    assert [(t["name"], t["status"], t["expected_busbw_gbps"]) for t in doc["tiers"]] == [("node", "fail", 100000.0)]
    assert json.loads(report.read_text())["preflight"]["tiers"][0]["status"] == "fail"
    saved = json.loads(rec.read_text())
    assert saved["tiers"]["node"]["busbw_gbps"] == doc["tiers"][0]["busbw_gbps"] > 0
    # Expect what a slow box once recorded (CPU timings vary too much to expect this box's own).
    saved["tiers"]["node"]["busbw_gbps"] = 0.05
    rec.write_text(json.dumps(saved))
    again = _cli("preflight", "--nproc-per-node", "2", "--size-mib", "1", "--iters", "3", "--expect", str(rec))
    assert again.returncode == 0, again.stderr
    line = again.stdout.splitlines()[0]
    assert line.startswith("PASS  node  2 ranks  busbw ")
    assert f"(expected >= 0.04: 0.05 GB/s recorded in {rec} x 0.8)" in line
    assert invoke("preflight", "--nproc-per-node", "2", "train.py").returncode == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    refused = invoke("preflight", "--nproc-per-node", "2", "--expect", str(bad))
    assert refused.returncode == 2 and "not a preflight recording" in refused.stderr


def test_run_preflight_starts_the_job_only_when_no_tier_failed(tmp_path: Path) -> None:
    """`run --preflight`: the same plan probed first; a failing tier starts nothing (exit 1)."""
    marker = tmp_path / "job-ran"
    job = ["--no-python", "--", sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    for expect, want_code in ((100000, 1), (0.0001, 0)):
        cfg = tmp_path / f"c{want_code}.yaml"
        cfg.write_text(
            "cluster:\n  nodes:\n    - {name: box, ip: 127.0.0.1, cpu_workers: 2}\n"
            "runtime: {binding: none, mem_policy: none}\n"
            f"preflight:\n  expect_busbw_gbps: {{node: {expect}}}\n  size_mib: 1\n  iters: 3\n"
        )
        proc = _cli("run", "--config", str(cfg), "--preflight", *job)
        assert proc.returncode == want_code, proc.stderr
        assert marker.exists() == (want_code == 0)
    assert "the job was not started" not in proc.stderr
