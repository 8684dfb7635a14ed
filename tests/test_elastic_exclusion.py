"""Failing nodes stay out of an elastic job (issue 28; docs/elastic.md, "Nodes taken out for good"):
real launchers on loopback, two config nodes with one GPU each (the recorded 2x H200 host's
snapshot: NVML is the absent hardware). A node whose rank fails with a recorded XID, and a node whose
GPU does not free its memory after a failed attempt, are taken out at the re-forming, written to the
exclude file, refused when they come back, and the job goes on without them. The XID and the GPU
memory are replayed from recordings of the real H200 host (``OPENCLAW_TEST_NVML``, run/gpu_memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from guards import GUARD_S, wait_for
from host import free_port, listening

from openclaw_launch.agents.exclude_file import REASONS_SUFFIX

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "configs" / "h200x2.snapshot.json"
SAMPLES = ROOT / "tests" / "data" / "nvml-samples-h200x2.json"  # the recorded H200s' NVML samples
GPU = ("GPU-584f87b1-e561-d9a3-aa91-5ea20ea584ee", "GPU-593502f1-407a-3b77-45a0-032830195d52")  # the snapshot's
CONFIG = f"""
cluster:
  nodes:
    - {{name: node0, ip: 127.0.0.1, gpus: [{{uuid: {GPU[0]}}}]}}
    - {{name: node1, ip: 127.0.0.1, gpus: [{{uuid: {GPU[1]}}}]}}
runtime:
  binding: none
  min_nodes: 1
  max_nodes: 2
"""
# A gloo rank: node1's fails once the world of two is formed (its launcher replays the XID first);
# node0's runs its world of one until the file STOP exists.
GLOO_WORKER = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
size = dist.get_world_size()
print(f"world size {size} restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if os.environ["GROUP_RANK"] == "1":
    sys.exit(1)
while size == 1 and not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("done", flush=True)
os._exit(0)
"""


def recording(path: Path, uuid: str, memory_mib: list[float], xid: int | None = None) -> dict[str, str]:
    """``uuid``'s recorded H200 samples, with each reading's used memory in turn (then the last held),
    and an XID event; the environment that makes a launcher replay it."""
    recorded = json.loads(SAMPLES.read_text())["samples"]
    sample = next(iter(recorded.values()))[0]
    samples = [{**sample, "memory_used_mib": mib} for mib in memory_mib]
    events = [{"kind": "xid", "uuid": uuid, "code": xid}] if xid is not None else []
    path.write_text(json.dumps({"samples": {uuid: samples}, "events": events}))
    return {"OPENCLAW_TEST_NVML": str(path)}


def recorded_memory_mib() -> tuple[float, float]:
    """A recorded H200's used memory before the run and during it (2430 and 22790 MiB)."""
    recorded = next(iter(json.loads(SAMPLES.read_text())["samples"].values()))
    used = [s["memory_used_mib"] for s in recorded]
    return used[0], max(used)


class Job:
    """The two nodes' launchers of one elastic job, started alike."""

    def __init__(self, tmp: Path, script: str) -> None:
        self.tmp = tmp
        (tmp / "cluster.yaml").write_text(CONFIG)
        (tmp / "train.py").write_text(script)
        self.ports = (free_port(), free_port())
        self.exclude = tmp / "exclude.txt"

    def start(self, node: str, name: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "SLURM", "TORCHELASTIC"))}
        environ.update(PYTHONPATH=str(ROOT), **(env or {}))
        cmd = [sys.executable, "-m", "openclaw_launch", "--config", str(self.tmp / "cluster.yaml"), "--node", node]
        cmd += ["--topology", str(SNAPSHOT), "--master-port", str(self.ports[0]), "--agent-port", str(self.ports[1])]
        cmd += ["--max-restarts", "2", "--restart-backoff-s", "0.05", "--grace-period-s", "2", "--telemetry", "api"]
        cmd += [
            "--gpu-memory-timeout-s",
            "1",
            "--exclude-file",
            str(self.exclude),
            "--report",
            str(self.tmp / f"{name}.json"),
        ]
        cmd += [str(self.tmp / "train.py"), str(self.tmp / "stop")]
        out, err = (self.tmp / f"{name}.out").open("w"), (self.tmp / f"{name}.err").open("w")
        return subprocess.Popen(cmd, cwd=self.tmp, env=environ, stdout=out, stderr=err, text=True)

    def said(self, name: str) -> str:
        return (self.tmp / f"{name}.err").read_text() + (self.tmp / f"{name}.out").read_text()

    def first(self) -> subprocess.Popen[str]:
        proc = self.start("node0", "a")
        wait_for(lambda: listening(self.ports[1]), "node0 never hosted the rendezvous")
        return proc


def _ended(proc: subprocess.Popen[str]) -> int:
    return proc.wait(timeout=GUARD_S)


@pytest.mark.usefixtures("served_agent_stores")
def test_a_node_failing_with_a_recorded_xid_is_taken_out_for_good(tmp_path: Path) -> None:
    job = Job(tmp_path, GLOO_WORKER)
    first = job.first()
    idle_mib, _ = recorded_memory_mib()
    failing = job.start("node1", "b", recording(tmp_path / "xid.json", GPU[1], [idle_mib], xid=79))
    assert _ended(failing) == 3, job.said("b")  # taken out: the job goes on without it
    assert "node node1 excluded after world 0: gpu-xid (NVML: XID 79 on GPU-593502f1" in job.said("b")
    assert [x["reason"] for x in json.loads((tmp_path / "b.json").read_text())["exclusions"]] == ["gpu-xid"]
    wait_for(lambda: "world size 1 restart 1" in job.said("a"), lambda: job.said("a"))
    again = job.start("node1", "c")  # the node comes back: refused at admission, the job untouched
    assert _ended(again) == 2, job.said("c")
    assert "node node1 was taken out of this job after world 0 (gpu-xid" in job.said("c")
    (tmp_path / "stop").touch()
    assert _ended(first) == 0, job.said("a")
    said = job.said("a")
    assert "refused the launcher" in said and "(node node1): node node1 excluded after world 0: gpu-xid" in said
    assert job.exclude.read_text() == "node1\n"
    assert "gpu-xid" in Path(str(job.exclude) + REASONS_SUFFIX).read_text()
    report = json.loads((tmp_path / "a.json").read_text())
    assert [(x["node"], x["reason"], x["world"]) for x in report["exclusions"]] == [("node1", "gpu-xid", 0)]
    assert [len(e["membership"]["excluded"]) for e in report["attempt_history"]] == [0, 1]


@pytest.mark.usefixtures("served_agent_stores")
def test_a_gpu_that_keeps_its_memory_takes_its_node_out(tmp_path: Path) -> None:
    """No torch: node1's worker fails at once; its GPU's memory stays at the recorded in-run level."""
    script = "import os, sys\nsys.exit(1 if os.environ['GROUP_RANK'] == '1' else 0)\n"
    job = Job(tmp_path, script)
    first = job.first()
    idle_mib, held_mib = recorded_memory_mib()
    held = job.start("node1", "b", recording(tmp_path / "held.json", GPU[1], [idle_mib, held_mib]))
    assert _ended(held) == 3, job.said("b")
    assert _ended(first) == 0, job.said("a")
    said = job.said("b")
    assert f"{GPU[1]}: {held_mib:.0f} MiB used, {idle_mib:.0f} MiB before the job" in said
    assert "GPU memory not freed after attempt 1" in said
    report = json.loads((tmp_path / "a.json").read_text())
    assert [x["reason"] for x in report["exclusions"]] == ["gpu-memory-held"]
    assert job.exclude.read_text() == "node1\n"


def test_an_exclude_file_that_cannot_be_written_or_a_fixed_size_job_exits_2_before_anything(tmp_path: Path) -> None:
    (tmp_path / "ro").mkdir(mode=0o500)
    (tmp_path / "cluster.yaml").write_text(CONFIG)
    base = [sys.executable, "-m", "openclaw_launch", "--config", str(tmp_path / "cluster.yaml"), "--node", "node0"]
    base += ["--topology", str(SNAPSHOT), "--exclude-file"]
    cases = [(str(tmp_path), "is a directory"), (str(tmp_path / "bad.txt"), "holds no Slurm hostlist")]
    (tmp_path / "bad.txt").write_text("n[1-\n")
    for command, (path, says) in zip(([], ["plan"]), cases, strict=True):  # run, and plan alike
        argv = [*base[:3], *command, *base[3:], path, "train.py"]
        p = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=GUARD_S)
        assert p.returncode == 2 and "--exclude-file" in p.stderr and says in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    fixed = [sys.executable, "-m", "openclaw_launch", "--nproc-per-node", "1", "--exclude-file", "x.txt", "t.py"]
    p = subprocess.run(fixed, capture_output=True, text=True, cwd=tmp_path, timeout=GUARD_S)
    assert p.returncode == 2 and "needs an elastic job" in p.stderr, p.stderr
    fixed_config = "cluster:\n  nodes:\n    - {name: n0, ip: 127.0.0.1, cpu_workers: 1}\nruntime:\n  exclude_file: "
    keys = (("x.txt", "runtime.exclude_file: needs an elastic job"), ("[1]", "(line 5): expected a string"))
    for value, says in keys:
        (tmp_path / "fixed.yaml").write_text(fixed_config + value + "\n")
        argv = [sys.executable, "-m", "openclaw_launch", "--config", "fixed.yaml", "t.py"]
        p = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=GUARD_S)
        assert p.returncode == 2 and says in p.stderr.replace("value for ", ""), p.stderr


def test_validate_shows_a_gpu_whose_memory_is_held_before_the_job(tmp_path: Path) -> None:
    """The recorded H200's in-run level on one GPU of the snapshot's host, with no job: a warning line."""
    _, held_mib = recorded_memory_mib()
    env = {**os.environ, **recording(tmp_path / "held.json", GPU[0], [held_mib])}
    cmd = [sys.executable, "-m", "openclaw_launch", "validate", "--config", "configs/h200x2.yaml"]
    p = subprocess.run([*cmd, "--topology", str(SNAPSHOT)], capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    held = [line for line in p.stdout.splitlines() if "gpu_memory_used" in line]
    assert held == [
        f"WARN  GPU 0 {GPU[0]}  gpu_memory_used: {held_mib:.0f} MiB used (expected <= 512 MiB with no job) - a process "
        "holds this GPU's memory (nvidia-smi --query-compute-apps=pid,used_memory): a job's leftover? An elastic "
        "job waits for this level after a failed attempt (--gpu-memory-timeout-s)"
    ]
