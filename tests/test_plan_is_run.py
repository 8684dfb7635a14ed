"""`plan --json` is what `run` executes: for the same command line, every worker's whole environment
is the launcher's with the plan's `env` over it, and it was exec'd with the plan's `argv` (numactl
prefix included), for a one-node run, a `--config` run with MPS and a two-node run. The only
values that may differ are the documented placeholders of docs/plan-format.md, each substituted
with what `run` really chose, and `TORCHELASTIC_RESTART_COUNT` (attempt 0 here, as the plan shows)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from guards import GUARD_S
from host import free_port, needs_torch

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/dump_worker.py"
FAKE_MPS = ROOT / "tests" / "fake_mps"
SNAPSHOT = "configs/h200x2.snapshot.json"
BOOTSTRAP = "openclaw_launch.telemetry.bootstrap"
DOCUMENTED_PLACEHOLDERS = {"<pid>", "<run-id>", "<free-port>"}

pytestmark = pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")


def launcher_env(tmp_path: Path, *path_first: Path) -> dict[str, str]:
    """The launcher's environment: ours, a recording numactl (and the stand-in MPS daemon) on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "numactl"
    record = 'printf \'%s\\0\' "$0" "$@" > "$PLAN_IS_RUN_DIR/numactl-$RANK"'
    wrapper.write_text(f'#!/bin/sh\n{record}\nexec {shutil.which("numactl")} "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "out").mkdir(exist_ok=True)
    path = os.pathsep.join([str(bindir), *map(str, path_first), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "PLAN_IS_RUN_DIR": str(tmp_path / "out")}


def plan_json(args: Sequence[str], env: Mapping[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "openclaw_launch", "plan", "--json", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD_S,
    )
    assert out.returncode == 0, out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def start_run(args: Sequence[str], env: Mapping[str, str] | None) -> subprocess.Popen[str]:
    """The launcher as a user starts it, its output captured (``env`` None: this one's)."""
    return subprocess.Popen(
        [sys.executable, "-m", "openclaw_launch", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> None:
    out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 0, out + err


def substituted(value: str, actual: Mapping[str, str]) -> str:
    for placeholder, real in actual.items():
        value = value.replace(placeholder, real)
    return value


def assert_worker_ran_the_plan(
    rank: Mapping[str, Any], launcher: Mapping[str, str], launcher_pid: int, out: Path
) -> None:
    """The worker of ``rank`` (plan JSON) saw exactly the planned argv and environment."""
    seen = json.loads((out / f"rank-{rank['rank']}.json").read_text())
    environ = seen["environ"]
    placeholders = set(re.findall(r"<[a-z-]+>", json.dumps(rank)))
    assert placeholders <= DOCUMENTED_PLACEHOLDERS, placeholders
    actual = {
        "<pid>": str(launcher_pid),
        "<run-id>": environ["TORCHELASTIC_RUN_ID"],
        "<free-port>": environ["MASTER_PORT"],
    }
    if "<run-id>" in placeholders:
        assert re.fullmatch(r"[0-9a-f]{12}", actual["<run-id>"]), actual
    if "<free-port>" in placeholders:
        assert actual["<free-port>"].isdigit() and environ["MASTER_PORT"] != "<free-port>"
    planned_env = {name: substituted(value, actual) for name, value in rank["env"].items()}
    assert environ == {**launcher, **planned_env}  # every name, every value: nothing added, nothing lost
    argv = [substituted(a, actual) for a in rank["argv"]]
    numactl = (out / f"numactl-{rank['rank']}").read_bytes().decode().split("\0")[:-1]
    assert numactl == argv  # what the launcher exec'd, numactl prefix included
    prefix = len(argv) - len(seen["cmdline"])
    assert argv[0] == shutil.which("numactl", path=launcher["PATH"]) and prefix > 1
    assert seen["cmdline"] == argv[prefix:]  # what numactl exec'd: the interpreter and the entry
    entry = argv[argv.index(BOOTSTRAP) + 1 :] if BOOTSTRAP in argv else argv[prefix + 2 :]
    assert seen["sys_argv"] == entry  # the script sees its own argv, as under plain python
    assert all(seen["exists"].values()), seen["exists"]  # the paths it was given are the run's


def test_one_node_with_hang_detection_runs_its_plan(tmp_path: Path) -> None:
    env = launcher_env(tmp_path)
    args = ["--nproc-per-node", "2", "--hang-timeout-s", "30", WORKER, "--lr", "0.1 0.2"]
    plan = plan_json(args, env)
    assert plan["run_id"] == "<run-id>" and plan["master_port"] is None and plan["hang_timeout_s"] == 30
    first = plan["ranks"][0]
    assert first["argv"][first["argv"].index("-u") + 1 : first["argv"].index("-u") + 3] == ["-m", BOOTSTRAP]
    for name in ("OPENCLAW_TELEMETRY_SOCKET", "TORCHELASTIC_ERROR_FILE", "OPENCLAW_STACKS_FILE"):
        assert "<pid>" in first["env"][name], name
    assert first["env"]["OPENCLAW_PROGRESS_INTERVAL_S"]
    proc = start_run(args, env)
    finish(proc)
    for rank in plan["ranks"]:
        assert_worker_ran_the_plan(rank, env, proc.pid, tmp_path / "out")


def test_config_with_mps_and_groups_runs_its_plan(tmp_path: Path) -> None:
    text = (ROOT / "configs" / "h200x2.yaml").read_text()
    cfg = tmp_path / "mps.yaml"
    cfg.write_text(text.replace("enable_mps: false", "enable_mps: true\n  mps_max_clients_per_gpu: 2", 1))
    env = launcher_env(tmp_path, FAKE_MPS)
    args = ["--config", str(cfg), "--topology", SNAPSHOT, "--telemetry", "full", "--tp", "2", WORKER]
    plan = plan_json(args, env)
    assert plan["mps"] is not None and plan["parallel"] is not None and plan["master_port"] == 29500
    first = plan["ranks"][0]["env"]
    assert first["CUDA_MPS_PIPE_DIRECTORY"].endswith("-<pid>/mps/pipe") and first["TORCH_FR_BUFFER_SIZE"] == "1000"
    assert first["OPENCLAW_TP_SIZE"] == "2" and first["OPENCLAW_PARALLEL_FILE"].endswith("-<pid>/parallel.json")
    proc = start_run(args, env)
    finish(proc)
    for rank in plan["ranks"]:
        assert_worker_ran_the_plan(rank, env, proc.pid, tmp_path / "out")


@needs_torch  # the agents meet through torch's TCPStore
def test_two_nodes_on_loopback_run_their_plans(tmp_path: Path) -> None:
    env = launcher_env(tmp_path)
    master, agents = str(free_port()), str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", master]
    common += ["--agent-port", agents, "--log-dir", str(tmp_path / "logs")]
    args = [[*common, "--node-rank", str(k), WORKER] for k in (0, 1)]
    plans = [plan_json(a, env) for a in args]
    assert [p["run_id"] for p in plans] == ["none", "none"]  # several nodes: torchrun's id, decided once
    error_file = f"{tmp_path}/logs/none/errors/attempt-0/rank-1/error.json"
    assert plans[1]["ranks"][0]["env"]["TORCHELASTIC_ERROR_FILE"] == error_file
    procs = [start_run(a, env) for a in args]
    for proc in procs:
        finish(proc)
    for plan, proc in zip(plans, procs, strict=True):
        for rank in plan["ranks"]:
            assert_worker_ran_the_plan(rank, env, proc.pid, tmp_path / "out")
