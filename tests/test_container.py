"""The project's Dockerfile in a real container engine (podman + runc, tests/container/engine.sh):
the image builds on a plain Debian base and on a base with torch (the stand-in for an operators'
PyTorch image); the launcher as the container's PID 1 trains the example, forwards `stop`,
passes a worker's exit code on, reaps orphans, writes its report to a volume and plans from a
config mounted at /config. Root only (podman as root, as the recipe); skipped with one line
elsewhere. The Debian and torch bases are cached images (built once by scripts/setup.sh); the
images and containers made here are removed at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "tests" / "container" / "engine.sh"
TORCH_BASE = "openclaw-base:bookworm-torch"
PLAIN_BASE = "openclaw-base:bookworm"
LIMITS = ["--ulimit", "nofile=10000:10000", "--ulimit", "nproc=30000:30000"]  # as engine.sh
RUN_ID = uuid.uuid4().hex[:8]
LABEL = f"openclaw-test={RUN_ID}"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "not root (podman runs as root here, see tests/container/engine.sh)"
    missing = [c for c in ("podman", "runc", "debootstrap") if shutil.which(c) is None]
    if missing:
        return f"no {', '.join(missing)} (scripts/setup.sh installs them as root on Debian)"
    return None


_WHY = _why_not()
if _WHY:
    pytest.skip(f"container tests skipped: {_WHY}", allow_module_level=True)

# host-wide: podman's images, containers and storage are the host's; an image build takes minutes
pytestmark = [pytest.mark.serial, pytest.mark.timeout(600)]


def podman(*args: str, timeout: float = GUARD_S, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            ["bash", str(ENGINE), "podman", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"podman {' '.join(args[:3])} ... did not finish in {timeout} s:\n{e.stderr}")
    if check and done.returncode != 0:
        pytest.fail(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def _engine(step: str, timeout: float) -> None:
    try:
        done = subprocess.run(["bash", str(ENGINE), step], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tests/container/engine.sh {step}: no result in {timeout} s (debootstrap or pip hung?)")
    if done.returncode != 0:
        pytest.fail(f"tests/container/engine.sh {step} failed, container tests cannot run:\n{done.stderr[-2000:]}")


def build(base: str, tag: str) -> float:
    """Build the project's Dockerfile on ``base``; the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="openclaw-pip-") as pip_dir:  # this machine's pip settings
        pip_mounts = subprocess.run(
            ["bash", str(ENGINE), "pipconf", pip_dir], capture_output=True, text=True, check=True, timeout=GUARD_S
        ).stdout.split()
        t0 = time.monotonic()
        podman(
            "build", "--layers=false", "--network", "host", *LIMITS, *pip_mounts,
            "--build-arg", f"BASE={base}", "--label", LABEL, "-t", tag, str(ROOT),
            timeout=300,
        )  # fmt: skip
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    """The launcher on the torch base (an operators' image, in small); removed afterwards with
    every container of this run."""
    _engine("base", 900)
    _engine("base-torch", 900)
    tag = f"localhost/openclaw-launch:test-{RUN_ID}"
    build(TORCH_BASE, tag)
    yield tag
    ids = podman("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
    if ids:
        podman("rm", "-f", "-t", "0", *ids, check=False)
    podman("rmi", "-f", tag, check=False)


def run_args(tmp_path: Path, *extra: str) -> list[str]:
    """`podman run` options shared by every test: the tests' workers and examples read-only, an
    output volume at /out, no network (loopback only: one node)."""
    return [
        "--label", LABEL, "--network", "none", *LIMITS,
        "-v", f"{ROOT / 'examples'}:/workspace/examples:ro",
        "-v", f"{ROOT / 'tests'}:/workspace/tests:ro",
        "-v", f"{tmp_path}:/out", *extra,
    ]  # fmt: skip


def fake(*args: str) -> list[str]:
    return ["--no-python", "--", "python3", "tests/fake_worker.py", *args]


def wait_files(paths: list[Path], name: str) -> None:
    def written() -> bool:
        state = podman("inspect", name, "--format", "{{.State.Status}}", check=False).stdout.strip()
        if state not in ("running", "created", "configured"):
            pytest.fail(f"container {state} before {paths}:\n{podman('logs', name, check=False).stderr}")
        return all(p.exists() for p in paths)

    wait_for(written, f"no {paths}", poll_s=0.1)


def test_image_builds_on_a_plain_debian_base(tmp_path: Path) -> None:
    """No torch, PEP 668 in force (the base does not set PIP_BREAK_SYSTEM_PACKAGES): the Dockerfile
    copes, the launcher is the entrypoint, numactl is there, no HEALTHCHECK, a few MB on the base."""
    _engine("base", 900)
    tag = f"localhost/openclaw-launch:plain-{RUN_ID}"
    try:
        build(PLAIN_BASE, tag)
        info = json.loads(podman("image", "inspect", tag).stdout)[0]
        base = json.loads(podman("image", "inspect", PLAIN_BASE).stdout)[0]
        assert info["Config"]["Entrypoint"] == ["python3", "-S", "/usr/local/bin/openclaw-launch-pid1"]
        assert not info["Config"].get("Healthcheck")
        assert info["Size"] - base["Size"] < 20e6, "the launcher should add a few MB, not more"
        assert "externally-managed" in podman("run", "--rm", *LIMITS, "--entrypoint", "sh", tag, "-c",
                                              "ls /usr/lib/python3.11/ | tr A-Z a-z").stdout  # fmt: skip
        done = podman("run", "--rm", *LIMITS, "--network", "none", tag, "--version", check=False)
        assert done.returncode == 0, done.stderr
        numa = podman("run", "--rm", *LIMITS, "--entrypoint", "numactl", tag, "--show")
        assert "physcpubind" in numa.stdout
        no_torch = podman("run", "--rm", *LIMITS, "--entrypoint", "python3", tag, "-c", "import torch", check=False)
        assert no_torch.returncode != 0, "the product image must not bring a torch of its own"
    finally:
        podman("rmi", "-f", tag, check=False)


def test_run_trains_the_example_on_two_cpu_ranks_and_reports_to_a_volume(image: str, tmp_path: Path) -> None:
    done = podman(
        "run", "--rm", *run_args(tmp_path), image,
        "--nproc-per-node", "2", "--report", "/out/run.json", "examples/train.py", "--steps", "20",
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "rank 0/2 on cpu" in out and "rank 1/2 on cpu" in out, out
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["exit_code"] == 0 and report["world_size"] == 2
    assert [r["exit_code"] for r in report["ranks"]] == [0, 0]
    assert all(r["statistics"]["steps"] >= 19 for r in report["ranks"]), report["ranks"]


def test_stop_sends_sigterm_to_the_workers_and_the_container_exits_143(image: str, tmp_path: Path) -> None:
    name = f"oc-stop-{RUN_ID}"
    podman(
        "run", "-d", "--name", name, *run_args(tmp_path), image,
        "--nproc-per-node", "2", "--grace-period-s", "10", "--report", "/out/run.json",
        *fake("--log-signals", "/out/sig-{rank}", "--grandchildren", "2", "--pids-file", "/out/pids-{rank}",
              "--ready-file", "/out/ready-{rank}", "--sleep", "120"),
    )  # fmt: skip
    wait_files([tmp_path / "ready-0", tmp_path / "ready-1"], name)
    # PID 1 is the launcher, which never imports torch (the image has one).
    assert "openclaw-launch" in podman("exec", name, "cat", "/proc/1/cmdline").stdout
    assert "torch" not in podman("exec", name, "cat", "/proc/1/maps").stdout
    before = podman("exec", name, "ps", "-eo", "pid,ppid,stat,args").stdout
    assert len(before.splitlines()) >= 1 + 1 + 2 + 4, before  # launcher, 2 workers, 4 grandchildren
    t0 = time.monotonic()
    podman("stop", "-t", "30", name)
    stop_s = time.monotonic() - t0
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    # 143 = 128 + SIGTERM from the launcher itself; podman's SIGKILL after -t 30 would give 137.
    assert state["ExitCode"] == 143, (state, podman("logs", name).stderr)
    assert stop_s < 15, f"stop took {stop_s:.1f} s"
    for rank in (0, 1):
        # the worker, and its grandchildren that log before the worker's exit ends them (they share
        # its handler and log file): SIGTERM and nothing else
        sigs = (tmp_path / f"sig-{rank}").read_text().split()
        assert sigs and set(sigs) == {"SIGTERM"}, sigs
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["signal_received"] == "SIGTERM" and report["exit_code"] == 143
    assert report["unkillable_pids"] == []
    assert [r["signal"] for r in report["ranks"]] == ["SIGTERM", "SIGTERM"], report["ranks"]
    assert "rank" in podman("logs", name).stderr + podman("logs", name).stdout  # the per-rank table


def test_a_worker_failure_exit_code_is_the_containers(image: str, tmp_path: Path) -> None:
    done = podman(
        "run", "--rm", *run_args(tmp_path), image, "--nproc-per-node", "2",
        *fake("--exit", "7", "--only-rank", "1", "--sleep", "0.5"),
        check=False,
    )  # fmt: skip
    assert done.returncode == 7, done.stdout + done.stderr
    assert "rank 1" in done.stdout + done.stderr


def test_pid1_reaps_the_zombies_of_orphaned_grandchildren(image: str, tmp_path: Path) -> None:
    done = podman(
        "run", "--rm", *run_args(tmp_path), image, "--nproc-per-node", "2",
        *fake("--orphan-child", "/out/orphan-{rank}"),
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert (tmp_path / f"orphan-{rank}").read_text() == "reaped"  # not left <defunct> by PID 1


def test_config_mounted_at_config_plans_with_a_recorded_topology(image: str, tmp_path: Path) -> None:
    done = podman(
        "run", "--rm", *run_args(tmp_path, "-v", f"{ROOT / 'configs'}:/config:ro"), image,
        "plan", "--config", "/config/h200x2.yaml", "--topology", "/config/h200x2.snapshot.json", "--json",
    )  # fmt: skip
    plan = json.loads(done.stdout)
    config_uuids = {line.split("uuid:")[1].strip() for line in
                    (ROOT / "configs" / "h200x2.yaml").read_text().splitlines() if "uuid:" in line}  # fmt: skip
    assert config_uuids and {r["gpu_uuid"] for r in plan["ranks"]} == config_uuids, plan
