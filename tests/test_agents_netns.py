"""Two agents in two network namespaces joined by a veth pair, each with its own address: identity
by IP address (no --node), and a link cut mid-job is noticed on both sides within the keep-alive;
every worker is gone afterwards. Needs root and `ip netns` (skipped with one line otherwise)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from guards import GUARD_S, read_until, wait_for
from host import needs_torch
from test_supervise_run import recorded_pids, wait_gone

ROOT = Path(__file__).resolve().parent.parent
# host-wide: namespaces and veth links of the host's own; the agents meet through torch's TCPStore
pytestmark = [pytest.mark.serial, needs_torch]


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=GUARD_S)


@pytest.fixture
def two_namespaces() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's ip")
    tag = uuid.uuid4().hex[:6]
    a, b = f"oca-{tag}", f"ocb-{tag}"
    made = ip("netns", "add", a)
    if made.returncode != 0:
        pytest.skip(f"ip netns unavailable here: {made.stderr.strip()}")
    try:
        steps = [
            ("netns", "add", b),
            ("link", "add", f"va-{tag}", "netns", a, "type", "veth", "peer", "name", f"vb-{tag}", "netns", b),
            ("-n", a, "addr", "add", "10.77.0.1/24", "dev", f"va-{tag}"),
            ("-n", b, "addr", "add", "10.77.0.2/24", "dev", f"vb-{tag}"),
            ("-n", a, "link", "set", f"va-{tag}", "up"),
            ("-n", b, "link", "set", f"vb-{tag}", "up"),
            ("-n", a, "link", "set", "lo", "up"),
            ("-n", b, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = ip(*step)
            if done.returncode != 0:
                pytest.skip(f"veth set-up failed here (ip {' '.join(step)}): {done.stderr.strip()}")
        yield a, b
    finally:
        ip("netns", "del", a)
        ip("netns", "del", b)


def test_identity_by_address_and_a_cut_link_stops_both_nodes(two_namespaces: tuple[str, str], tmp_path: Path) -> None:
    a, b = two_namespaces
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "cluster:\n  nodes:\n"
        "    - {name: left, ip: 10.77.0.1, cpu_workers: 1}\n"
        "    - {name: right, ip: 10.77.0.2, cpu_workers: 1}\n"
        "runtime: {binding: none, master_port: 29611}\n"
    )
    worker = [sys.executable, str(ROOT / "tests" / "fake_worker.py"), "--sleep", "120"]
    worker += ["--ready-file", f"{tmp_path}/ready-{{rank}}", "--pids-file", f"{tmp_path}/pids-{{rank}}"]
    procs = {}
    for ns, name in ((a, "left"), (b, "right")):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "openclaw_launch", "--config", str(config)]
        cmd += ["--keepalive-s", "2", "--grace-period-s", "2", "--telemetry", "off"]
        cmd += ["--report", str(tmp_path / f"report-{name}.json"), "--no-python", "--", *worker]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env = {k: v for k, v in env.items() if not k.startswith("SLURM")}
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    try:
        _cut_and_check(procs, tmp_path, b, f"vb-{a[4:]}")
    finally:  # a failed assertion must not leave a launcher behind
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=GUARD_S)


def _cut_and_check(procs: dict[str, subprocess.Popen[str]], tmp_path: Path, ns: str, link: str) -> None:
    def started() -> bool:
        if any(p.poll() is not None for p in procs.values()):
            outs = {n: p.communicate(timeout=GUARD_S) for n, p in procs.items()}
            pytest.fail(f"a launcher ended before its workers started: {outs}")
        return all((tmp_path / f"ready-{r}").exists() for r in range(2))

    wait_for(started, "workers never started", poll_s=0.05)
    cut = time.monotonic()
    assert ip("-n", ns, "link", "set", link, "down").returncode == 0
    took = {}
    for name, p in procs.items():
        p.wait(timeout=GUARD_S)
        took[name] = time.monotonic() - cut
    outs = {n: p.communicate(timeout=GUARD_S) for n, p in procs.items()}
    for name in ("left", "right"):
        code, text = procs[name].returncode, outs[name][0] + outs[name][1]
        assert code == 1, text
        assert took[name] < 2 + 5, f"{name} took {took[name]:.1f} s"
        assert json.loads((tmp_path / f"report-{name}.json").read_text())["node"] == name  # found by its address
    assert "node right is lost" in outs["left"][1]
    assert "lost the first node left's agent" in outs["right"][1]
    wait_gone(recorded_pids(tmp_path))


def test_c10d_without_node_rank_ranks_the_nodes_at_head_whichever_starts_first(
    two_namespaces: tuple[str, str], tmp_path: Path
) -> None:
    """torchrun's `srun` line on two hosts: the launcher of the other host starts first and waits
    for HEAD's store (saying so); HEAD's launcher hosts it and is node rank 0, the other node 1;
    MASTER_ADDR is HEAD, MASTER_PORT one free port of HEAD's for both."""
    a, b = two_namespaces
    worker = [sys.executable, str(ROOT / "tests" / "fake_worker.py"), "--write-env", f"{tmp_path}/env-{{rank}}.json"]
    line = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.77.0.1:29655"]
    env = {k: v for k, v in {**os.environ, "PYTHONPATH": str(ROOT)}.items() if not k.startswith("SLURM")}
    procs = {}
    try:
        for ns in (b, a):
            cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "openclaw_launch", *line, "--telemetry", "off"]
            procs[ns] = subprocess.Popen(
                [*cmd, "--no-python", "--", *worker],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            if ns == b:  # b is there first, waiting for HEAD's store
                seen = read_until(procs[b], "waiting for the first node's agent at 10.77.0.1:29655")
        outs = {ns: p.communicate(timeout=GUARD_S) for ns, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=GUARD_S)
    assert [procs[ns].returncode for ns in (a, b)] == [0, 0], outs
    assert "node rank 0 of 2 (by arrival at 10.77.0.1:29655)" in outs[a][1]
    assert "node rank 1 of 2 (by arrival at 10.77.0.1:29655)" in seen + outs[b][1]
    envs = [json.loads((tmp_path / f"env-{r}.json").read_text())["environ"] for r in range(2)]
    assert [(e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "0", "2"), ("1", "1", "2")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.77.0.1", envs[0]["MASTER_PORT"])}
    assert envs[0]["MASTER_PORT"] != "29655"


def test_a_node_with_another_nccl_and_an_extra_cuda_variable_is_refused_on_both(
    two_namespaces: tuple[str, str], tmp_path: Path
) -> None:
    """Two hosts' launchers, one with a different NCCL wheel on its PYTHONPATH (real metadata, read
    without importing anything) and CUDA_LAUNCH_BLOCKING=1: neither starts a worker; both name both."""
    a, b = two_namespaces
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "cluster:\n  nodes:\n"
        "    - {name: left, ip: 10.77.0.1, cpu_workers: 1}\n"
        "    - {name: right, ip: 10.77.0.2, cpu_workers: 1}\n"
        "runtime: {binding: none, master_port: 29613}\n"
    )
    wheel = tmp_path / "site" / "nvidia_nccl_cu12-2.27.3.dist-info"
    wheel.mkdir(parents=True)
    (wheel / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu12\nVersion: 2.27.3\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NCCL_", "CUDA_"))}
    envs = {
        "left": {**base, "PYTHONPATH": str(ROOT)},
        "right": {**base, "PYTHONPATH": f"{ROOT}{os.pathsep}{wheel.parent}", "CUDA_LAUNCH_BLOCKING": "1"},
    }
    worker = [sys.executable, str(ROOT / "tests" / "fake_worker.py"), "--ready-file", f"{tmp_path}/ready-{{rank}}"]
    procs = {}
    for ns, name in ((a, "left"), (b, "right")):
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "openclaw_launch", "--config", str(config)]
        cmd += ["--telemetry", "off", "--agent-timeout-s", "60", "--no-python", "--", *worker]
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=envs[name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    outs = {n: p.communicate(timeout=GUARD_S) for n, p in procs.items()}
    for name, p in procs.items():
        text = outs[name][0] + outs[name][1]
        assert p.returncode == 2, text
        assert "the nodes do not agree; started nothing on any node" in text
        assert "node right: env.CUDA_LAUNCH_BLOCKING = '1', node left has <unset>" in text
        assert "node right: version.nccl = '2.27.3', node left has <unset>" in text
    assert not list(tmp_path.glob("ready-*"))
