"""The agents' pure parts: Slurm hostlists, fingerprints and their differences, the job report's
merge (stragglers named by node and rank), and forwarded-only signals in the supervisor."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from supervise_driver import make_plan

from openclaw_launch.agents.fingerprint import differences, fingerprint
from openclaw_launch.agents.hostlist import expand_hostlist, parse_hostlist
from openclaw_launch.agents.merge import merge_reports, node_payload
from openclaw_launch.config.model import Config, NodeSpec, Runtime
from openclaw_launch.errors import PlanError
from openclaw_launch.plan.build import Entry, PlanOptions, build_plan
from openclaw_launch.run.supervise import JobResult, SuperviseOptions, supervise
from openclaw_launch.stats.collect import PhaseSummary, RankSummary
from openclaw_launch.topology.model import Topology

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[1-2,5]", ["n1", "n2", "n5"]),
        ("gpu-a[01-03],gpu-b7", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-b7"]),
        ("c[08-10]", ["c08", "c09", "c10"]),  # zero padding kept across a width change
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("login", ["login"]),
        ("a,b[3],c-1", ["a", "b3", "c-1"]),
    ],
)
def test_slurm_hostlists_expand(text: str, hosts: list[str]) -> None:
    assert parse_hostlist(text) == hosts
    assert expand_hostlist(text, use_scontrol=False) == hosts


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="no scontrol on PATH")
def test_scontrol_agrees_with_the_parser() -> None:
    assert expand_hostlist("gpu-a[01-03],gpu-b7") == parse_hostlist("gpu-a[01-03],gpu-b7")


@pytest.mark.parametrize("text", ["n[1-", "n1]", "n[a-b]", "n[3-1]"])
def test_malformed_hostlists_are_errors(text: str) -> None:
    with pytest.raises(PlanError, match="malformed Slurm hostlist"):
        parse_hostlist(text)


def _config(nthreads: int | None = None) -> Config:
    nodes = (NodeSpec(name="a", ip="10.0.0.1", cpu_workers=2), NodeSpec(name="b", ip="10.0.0.2", cpu_workers=1))
    return Config(nodes=nodes, runtime=Runtime(nccl_nthreads=nthreads), source="c.yaml")


def _fp(node: str, config: Config, env: dict[str, str], versions: dict[str, str] | None = None) -> dict[str, str]:
    topo = Topology(numa_nodes={0: (0, 1, 2, 3)}, allowed_cpus=(0, 1, 2, 3), source="test:cpus")
    plan = build_plan(config, topo, PlanOptions(entry=Entry("script", "t.py"), node=node, base_env=env, run_id="j"))
    return fingerprint(config, plan, versions or {"torch": "2.13.0"}, env)


def test_same_job_same_fingerprint_on_every_node() -> None:
    prints = {"a": _fp("a", _config(), {}), "b": _fp("b", _config(), {})}
    assert differences(prints) == []
    assert prints["a"]["job.master"] == "10.0.0.1:29500" and prints["a"]["job.world_size"] == "3"


def test_one_nccl_variable_one_config_value_one_version_each_named_with_both_values() -> None:
    prints = {
        "a": _fp("a", _config(), {}),
        "b": _fp("b", _config(nthreads=8), {"NCCL_DEBUG": "INFO"}, {"torch": "2.12.0"}),
    }
    assert differences(prints) == [
        "node b: config.runtime.nccl_nthreads = '8', node a has 'null'",
        "node b: env.NCCL_DEBUG = 'INFO', node a has <unset>",
        "node b: env.NCCL_NTHREADS = '8', node a has <unset>",
        "node b: version.torch = '2.12.0', node a has '2.13.0'",
    ]


def _summary(rank: int, step_s: float, work_s: float) -> RankSummary:
    wait = step_s - work_s
    return RankSummary(
        rank=rank,
        steps=20,
        measured_steps=17,
        step_p50_s=step_s,
        step_p90_s=step_s,
        step_p99_s=step_s,
        step_max_s=step_s,
        step_mean_s=step_s,
        phases={
            "compute": PhaseSummary(work_s, work_s, work_s, work_s / step_s),
            "sync": PhaseSummary(wait, wait, wait, wait / step_s),
        },
        sync_phases=("sync",),
        gpu_sync_s=None,
        gpu_late_s=None,
        step_source="api",
        dropped_batches=0,
    )


def _node_report(node: str, ranks: list[int], code: int = 0) -> dict[str, object]:
    def entry(rank: int) -> dict[str, object]:
        return {"rank": rank, "node": node, "exit_code": code, "signal": None, "statistics": None, "gpu": None}

    return {
        "schema": "openclaw-report/2",
        "run_id": "j",
        "node": node,
        "world_size": 3,
        "exit_code": code,
        "attempts": 1,
        "signal_received": None,
        "root_cause": None,
        "unkillable_pids": [],
        "statistics": {"threshold_pct": 5.0, "gpu_error": None, "bad_datagrams": 0},
        "stragglers": [],
        "ranks": [entry(r) for r in ranks],
    }


def test_job_report_judges_stragglers_over_every_node_and_names_node_and_rank() -> None:
    a = node_payload(
        _node_report("a", [0, 1]),
        {"summaries": [_summary(0, 0.1, 0.05), _summary(1, 0.1, 0.05)], "threshold_pct": 5.0},
    )
    b = node_payload(_node_report("b", [2]), {"summaries": [_summary(2, 0.1, 0.095)], "threshold_pct": 5.0})
    job = merge_reports([a, b], ["a", "b", "c"], 0, None)
    assert job["scope"] == "job" and [r["rank"] for r in job["ranks"]] == [0, 1, 2]
    assert [n["node"] for n in job["nodes"]] == ["a", "b"] and job["missing_nodes"] == ["c"]
    assert [(s["node"], s["rank"]) for s in job["stragglers"]] == [("b", 2)]
    assert job["ranks"][0]["statistics"]["wait_share"] > 0.4  # rank 0 waited for rank 2 on node b


def test_a_variable_the_workers_inherit_from_one_launcher_is_a_difference() -> None:
    """The plan copies no CUDA_* variable, but the workers inherit the launcher's environment."""
    prints = {
        "a": _fp("a", _config(), {}),
        "b": _fp("b", _config(), {"CUDA_LAUNCH_BLOCKING": "1", "CUDA_VISIBLE_DEVICES": "3", "SLURM_NODEID": "1"}),
    }
    assert differences(prints) == ["node b: env.CUDA_LAUNCH_BLOCKING = '1', node a has <unset>"]


def test_supervisor_forwards_usr1_without_stopping_and_stops_on_term(tmp_path: Path) -> None:

    log, ready = tmp_path / "sig-{rank}", tmp_path / "ready-{rank}"
    worker = ["--log-signals", str(log), "--survive-usr", "--ready-file", str(ready), "--sleep", "2"]
    plan = make_plan(2, worker)
    opts = SuperviseOptions(pass_signals=(signal.SIGUSR1, signal.SIGUSR2), use_guardian=False, grace_period_s=2)

    def poke() -> None:
        deadline = time.monotonic() + 20
        while not all((tmp_path / f"ready-{r}").exists() for r in range(2)) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=poke, daemon=True).start()
    result: JobResult = supervise(plan, opts)
    assert result.exit_code == 0 and result.signal_received is None  # the job went on to its end
    assert [(tmp_path / f"sig-{r}").read_text() for r in range(2)] == ["SIGUSR1\n", "SIGUSR1\n"]


def test_forward_signals_option_is_checked() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "--forward-signals", "SIGKILL", "--dry-run", "t.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 2 and "--forward-signals" in out.stderr


def test_a_one_node_run_never_imports_torch() -> None:
    """The agents (and torch's TCPStore) are for several nodes only: one node starts without torch."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "openclaw_launch", "--nproc-per-node", "1", "--telemetry", "off"]
        + ["--no-python", "--", "true"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "openclaw_launch.run.supervise" in imported and not {m for m in imported if m.split(".")[0] == "torch"}
