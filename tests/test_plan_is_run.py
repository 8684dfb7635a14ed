"""`plan --json` is what `run` executes: for the same command line, every worker's whole environment
is the launcher's with the plan's `env` over it, and it was exec'd with the plan's `argv` (numactl
prefix included), for a one-node run, a `--config` run with MPS, a two-node run, a restart, node
ranks by arrival and an elastic world re-formed (from flags, and from a config whose file no longer
parses by then). The only values that may differ are the documented placeholders of
docs/plan-format.md, each substituted with what `run` really chose, and the two variables of an
attempt after the first (`TORCHELASTIC_RESTART_COUNT`, the error file's `attempt-N/`)."""

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
from guards import GUARD_S, wait_for
from host import free_port, listening, needs_torch

ROOT = Path(__file__).resolve().parent.parent
WORKER = "tests/dump_worker.py"
FAKE_MPS = ROOT / "tests" / "fake_mps"
SNAPSHOT = "configs/h200x2.snapshot.json"
BOOTSTRAP = "openclaw_launch.telemetry.bootstrap"
DOCUMENTED_PLACEHOLDERS = {"<pid>", "<run-id>", "<free-port>", "<nonce>", "<token>"}

pytestmark = pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl not installed")


def launcher_env(tmp_path: Path, *path_first: Path) -> dict[str, str]:
    """The launcher's environment: ours, a recording numactl (and the stand-in MPS daemon) on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    wrapper = bindir / "numactl"
    record = 'printf \'%s\\0\' "$0" "$@" > "$PLAN_IS_RUN_DIR/numactl-$RANK-$TORCHELASTIC_RESTART_COUNT"'
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
    rank: Mapping[str, Any], launcher: Mapping[str, str], launcher_pid: int, out: Path, attempt: int = 0
) -> None:
    """The worker of ``rank`` (plan JSON) in ``attempt`` saw exactly the planned argv and environment."""
    seen = json.loads((out / f"rank-{rank['rank']}-attempt-{attempt}.json").read_text())
    environ = seen["environ"]
    placeholders = set(re.findall(r"<[a-z-]+>", json.dumps(rank)))
    assert placeholders <= DOCUMENTED_PLACEHOLDERS, placeholders
    actual = {
        "<pid>": str(launcher_pid),
        "<run-id>": environ["TORCHELASTIC_RUN_ID"],
        "<free-port>": environ["MASTER_PORT"],
        # the statistics channel's: its name's last part, the token as the rank got it
        "<nonce>": environ.get("OPENCLAW_TELEMETRY_SOCKET", "-").rsplit("-", 1)[1],
        "<token>": environ.get("OPENCLAW_TELEMETRY_TOKEN", ""),
    }
    if "<token>" in placeholders:
        assert re.fullmatch(r"[0-9a-f]{16}", actual["<nonce>"]) and re.fullmatch(r"[0-9a-f]{32}", actual["<token>"])
    if "<run-id>" in placeholders:
        assert re.fullmatch(r"[0-9a-f]{12}", actual["<run-id>"]), actual
    if "<free-port>" in placeholders:
        assert actual["<free-port>"].isdigit() and environ["MASTER_PORT"] != "<free-port>"
    planned_env = {name: substituted(value, actual) for name, value in rank["env"].items()}
    assert environ == {**launcher, **planned_env}  # every name, every value: nothing added, nothing lost
    argv = [substituted(a, actual) for a in rank["argv"]]
    numactl = (out / f"numactl-{rank['rank']}-{attempt}").read_bytes().decode().split("\0")[:-1]
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
@pytest.mark.usefixtures("served_agent_stores")
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


def attempt_of(rank: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """The plan's ``rank`` as attempt N starts it (the plan shows attempt 0's, docs/plan-format.md):
    its TORCHELASTIC_RESTART_COUNT, and its error file in the run's ``attempt-N/``."""
    env = {**rank["env"], "TORCHELASTIC_RESTART_COUNT": str(attempt)}
    env["TORCHELASTIC_ERROR_FILE"] = env["TORCHELASTIC_ERROR_FILE"].replace("/attempt-0/", f"/attempt-{attempt}/")
    return {**rank, "env": env}


def written(*paths: Path) -> bool:
    return all(path.exists() for path in paths)


def test_a_restart_runs_the_plans_next_attempt(tmp_path: Path) -> None:
    """Every rank fails in attempt 0; both attempts run the plan, attempt 1 with its restart count and
    its own error file."""
    env = {**launcher_env(tmp_path), "PLAN_IS_RUN_FIRST_ATTEMPT": "fail"}
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--restart-backoff-s", "0", WORKER]
    plan = plan_json(args, env)
    proc = start_run(args, env)
    finish(proc)
    for rank in plan["ranks"]:
        for attempt in (0, 1):
            assert_worker_ran_the_plan(attempt_of(rank, attempt), env, proc.pid, tmp_path / "out", attempt)


@needs_torch  # the agents meet through torch's TCPStore
@pytest.mark.usefixtures("served_agent_stores")
def test_node_ranks_by_arrival_run_the_plans_of_their_ranks(tmp_path: Path) -> None:
    """c10d without --node-rank: the first launcher at the endpoint hosts the rendezvous and is node
    rank 0; it runs the plan ``plan`` shows (node rank 0's). The other runs the plan of the rank it
    was given (``plan --node-rank 1``), with node rank 0's free port as MASTER_PORT, the same on both."""
    env = launcher_env(tmp_path)
    port = free_port()
    line = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "arrival"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{port}"]
    shown = plan_json([*line, WORKER], env)
    assert shown["node_rank"] == 0 and any("<arrival>" in w for w in shown["warnings"])
    second_rank = plan_json([*line, "--node-rank", "1", WORKER], env)["ranks"][0]
    second_rank["env"]["MASTER_PORT"] = "<free-port>"  # by arrival: node rank 0's, given at the rendezvous
    first = start_run([*line, WORKER], env)
    wait_for(lambda: listening(port), f"nothing listened on {port}")
    second = start_run([*line, WORKER], env)
    finish(first)
    finish(second)
    out = tmp_path / "out"
    assert_worker_ran_the_plan(shown["ranks"][0], env, first.pid, out)
    assert_worker_ran_the_plan(second_rank, env, second.pid, out)
    ports = {json.loads((out / f"rank-{r}-attempt-0.json").read_text())["environ"]["MASTER_PORT"] for r in (0, 1)}
    assert len(ports) == 1, ports


@needs_torch  # the agents meet through torch's TCPStore
@pytest.mark.usefixtures("served_agent_stores")
def test_a_reformed_elastic_world_runs_the_plan_of_that_world(tmp_path: Path) -> None:
    """--nnodes 1:2: two launchers form a world of two, and the second is killed; the first re-forms a
    world of one (attempt 1), whose rank runs what ``plan`` shows for the line (a world of MIN nodes,
    marked as one world's plan), as attempt 1."""
    env = {**launcher_env(tmp_path), "PLAN_IS_RUN_FIRST_ATTEMPT": "wait"}
    port = free_port()
    line = ["--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "job7"]
    line += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=30", "--max-restarts", "1"]
    plan = plan_json([*line, WORKER], env)
    assert plan["elastic"] == {"min_nodes": 1, "max_nodes": 2} and plan["nnodes"] == 1
    first = start_run([*line, WORKER], env)
    wait_for(lambda: listening(port), f"nothing listened on {port}")
    second = start_run([*line, WORKER], env)
    out = tmp_path / "out"
    wait_for(lambda: written(out / "rank-0-attempt-0.json", out / "rank-1-attempt-0.json"), "no world of two")
    second.kill()
    second.communicate(timeout=GUARD_S)
    finish(first)
    assert_worker_ran_the_plan(attempt_of(plan["ranks"][0], 1), env, first.pid, out, 1)


ELASTIC_CONFIG = """
cluster:
  nodes:
    - {name: node0, ip: 127.0.0.1, cpu_workers: 1}
    - {name: node1, ip: 127.0.0.1, cpu_workers: 1}
runtime:
  env: {PLAN_IS_RUN_CONFIG: as-started}
"""
ELASTIC_RANGE = "  min_nodes: 1\n  max_nodes: 2\n"


@needs_torch  # the agents meet through torch's TCPStore
@pytest.mark.usefixtures("served_agent_stores")
def test_a_reformed_world_is_planned_from_the_config_the_job_started_with(tmp_path: Path) -> None:
    """The YAML is replaced by one that does not parse while the world of two runs (which runs what
    ``plan`` shows: the config's nodes); node1 is lost, and node0's world of one is planned from the
    config read at the start: its rank runs what ``plan`` shows for node0 alone, as attempt 1."""
    env = {**launcher_env(tmp_path), "PLAN_IS_RUN_FIRST_ATTEMPT": "wait"}
    config, alone = tmp_path / "cluster.yaml", tmp_path / "alone.yaml"
    config.write_text(ELASTIC_CONFIG + ELASTIC_RANGE)
    alone.write_text(ELASTIC_CONFIG.replace("    - {name: node1, ip: 127.0.0.1, cpu_workers: 1}\n", ""))
    master, agents = free_port(), free_port()
    common = ["--master-port", str(master), "--run-id", "started", "--max-restarts", "1"]
    line = ["--config", str(config), "--agent-port", str(agents), *common]
    shown = plan_json([*line, "--node", "node0", WORKER], env)
    assert shown["elastic"] == {"min_nodes": 1, "max_nodes": 2} and shown["nnodes"] == 2
    world_of_one = plan_json(["--config", str(alone), "--node", "node0", *common, WORKER], env)
    assert world_of_one["elastic"] is None and world_of_one["nnodes"] == 1
    first = start_run([*line, "--node", "node0", WORKER], env)
    wait_for(lambda: listening(agents), f"nothing listened on {agents}")
    second = start_run([*line, "--node", "node1", WORKER], env)
    out = tmp_path / "out"
    wait_for(lambda: written(out / "rank-0-attempt-0.json", out / "rank-1-attempt-0.json"), "no world of two")
    config.write_text("cluster: [this is not a config\n")
    second.kill()
    second.communicate(timeout=GUARD_S)
    finish(first)
    assert_worker_ran_the_plan(shown["ranks"][0], env, first.pid, out)
    assert_worker_ran_the_plan(attempt_of(world_of_one["ranks"][0], 1), env, first.pid, out, 1)


def test_the_json_of_an_elastic_plan_says_it_is_one_worlds(tmp_path: Path) -> None:
    """``elastic`` in the plan's JSON: the node range of a flag-based and of a config-based elastic
    job; null for a fixed-size one (docs/plan-format.md)."""
    from cli_runner import invoke

    config = tmp_path / "cluster.yaml"
    config.write_text(ELASTIC_CONFIG + ELASTIC_RANGE)
    flags = ["--nnodes", "1:4", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:9"]
    cases = {
        (1, 4): [*flags, WORKER],
        (1, 2): ["--config", str(config), "--node", "node0", WORKER],
        None: ["--nproc-per-node", "1", WORKER],
    }
    for nodes, args in cases.items():
        shown = invoke("plan", "--json", *args)
        assert shown.returncode == 0, shown.stderr
        expected = {"min_nodes": nodes[0], "max_nodes": nodes[1]} if nodes else None
        assert json.loads(shown.stdout)["elastic"] == expected, args
